"""InternVL 3 in HF format: images preprocessed by the gateway's InternVL family (tiles plus a
thumbnail, `<img>` + 256 `<IMG_CONTEXT>` per tile + `</img>`) equal vLLM's own OpenAI server on
a tiny random-weight model. vLLM does not normalize this model's pixels on device, so the
gateway sends normalized float32. Images are up to 13 tiles (3,330 tokens): max_model_len 8192.
"""

from __future__ import annotations

import pytest

from tests.support.family_e2e import assert_slot_check_refuses, serve_both
from tests.support.internvl_models import build_model

ENGINE = {"limit_mm_per_prompt": {"image": 2}, "max_model_len": 8192}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("internvl") / "model")


@pytest.fixture(scope="module")
def pair(model, tmp_path_factory):
    with serve_both(model, tmp_path_factory.mktemp("internvl-logs"), **ENGINE) as pair:
        yield pair


@pytest.fixture(scope="module")
def reference(pair):
    return pair.reference()


def test_the_gateway_has_this_family(model):
    from gateway.render.model_files import ModelFiles
    from multimodal.processors.internvl import InternVLProcessor
    from multimodal.registry import processors_for

    assert type(processors_for(ModelFiles.load(model)).get("image")) is InternVLProcessor


def test_images_equal_vllm_s_server(pair, reference):
    assert pair.ours() == reference
    # the gateway preprocessed them itself
    assert "no image processor here" not in pair.gateway.log_path.read_text()


def test_the_tiny_model_answers_varied_text(reference):
    # Not one token repeated ("gestgestgest..." at a smaller initializer range), and the
    # answer depends on the images.
    texts = [text for _, text in reference.values()]
    assert len(set(texts)) == len(texts)
    assert all(len(set(text)) > 8 for text in texts), texts


def test_a_placeholder_one_embedding_short_is_refused_by_the_worker(pair):
    assert_slot_check_refuses(pair)
