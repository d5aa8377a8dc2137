"""LLaVA-OneVision: images preprocessed by the gateway's family (LLaVA-NeXT's anyres tiles with
OneVision's anyres_max_9 cap: 729 base tokens plus up to ~9 tiles' worth, each image of a
request tiled on its own as vLLM does) equal vLLM's own OpenAI server on a tiny random-weight
model: prompt token counts and greedy text. vLLM does not normalize this model's pixels on
device, so the gateway sends normalized float32. Prompts run to ~15,000 tokens for two large
images: max_model_len 16384."""

from __future__ import annotations

import pytest

from tests.support.family_e2e import assert_slot_check_refuses, serve_both
from tests.support.llava_onevision_models import build_model

ENGINE = {"limit_mm_per_prompt": {"image": 2}, "max_model_len": 16384}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("llava_onevision") / "model")


@pytest.fixture(scope="module")
def pair(model, tmp_path_factory):
    with serve_both(model, tmp_path_factory.mktemp("llava-onevision-logs"), **ENGINE) as pair:
        yield pair


@pytest.fixture(scope="module")
def reference(pair):
    return pair.reference()


def test_the_gateway_has_this_family(model):
    from gateway.render.model_files import ModelFiles
    from multimodal.processors.llava_onevision import LlavaOnevisionProcessor
    from multimodal.registry import processors_for

    assert type(processors_for(ModelFiles.load(model)).get("image")) is LlavaOnevisionProcessor


def test_images_equal_vllm_s_server(pair, reference):
    assert pair.ours() == reference
    # the gateway preprocessed them itself
    assert "no image processor here" not in pair.gateway.log_path.read_text()


def test_the_tiny_model_answers_varied_text(reference):
    # The answer depends on the images, and is not one token repeated.
    texts = [text for _, text in reference.values()]
    assert len(set(texts)) == len(texts), reference
    assert all(len(set(text)) > 8 for text in texts), texts


def test_a_placeholder_one_embedding_short_is_refused_by_the_worker(pair):
    assert_slot_check_refuses(pair)
