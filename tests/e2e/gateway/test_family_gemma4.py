"""Gemma 4: images preprocessed by the gateway's Gemma 4 family (aspect-preserving resize under a
280 soft-token budget, padded 16 px patches with their positions, `<|image>` + n `<|image|>` +
`<image|>` per image) equal vLLM's own OpenAI server on a tiny random-weight
Gemma4ForConditionalGeneration: prompt token counts and greedy text. vLLM does not normalize
Gemma 4's pixels on device, so the gateway sends rescaled float32. A request's own budget
(`max_soft_tokens`) is served with vLLM's count; the worker's slot check, which counts the
pooled blocks of `pixel_position_ids` (vLLM's rule needs the image size and the request's
kwargs), refuses a placeholder one `<|image|>` short; SMG 1.13, which preprocesses Gemma 4
itself, drives our worker.
"""

from __future__ import annotations

import pytest

from tests.support.e2e_cases import IMAGE, make_image
from tests.support.family_e2e import (
    answers,
    ask,
    assert_slot_check_refuses,
    serve_both,
    vllm_prompt_ids,
)
from tests.support.gemma4_models import build_model

ENGINE = {"limit_mm_per_prompt": {"image": 2}, "max_model_len": 4096}
# Two images of the same size (the same prompt), different pixels.
TWINS = [("first", [make_image(300, 200, seed=31)]), ("second", [make_image(300, 200, seed=32)])]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("gemma4") / "model")


@pytest.fixture(scope="module")
def pair(model, tmp_path_factory):
    with serve_both(model, tmp_path_factory.mktemp("gemma4-logs"), **ENGINE) as pair:
        yield pair


@pytest.fixture(scope="module")
def reference(pair):
    return pair.reference()


def test_the_gateway_has_this_family(model):
    from gateway.render.model_files import ModelFiles
    from multimodal.processors.gemma4 import Gemma4Processor
    from multimodal.registry import processors_for

    assert type(processors_for(ModelFiles.load(model)).get("image")) is Gemma4Processor


def test_images_equal_vllm_s_server(pair, reference):
    assert pair.ours() == reference
    # the gateway preprocessed them itself
    assert "no image processor here" not in pair.gateway.log_path.read_text()


def test_the_answer_depends_on_the_image(pair):
    # Two images of one size make the same prompt but for their pixels: a random model that
    # ignored them (or repeated one token) would answer both alike.
    want = pair.reference(TWINS)
    (first_tokens, first), (second_tokens, second) = want["first"], want["second"]
    assert first_tokens == second_tokens and first != second
    assert all(len(set(text)) > 5 for text in (first, second)), want
    assert pair.ours(TWINS) == want


@pytest.mark.parametrize(
    "options",
    [
        {"max_soft_tokens": 70},
        {"max_soft_tokens": 560},
        {"images_kwargs": {"max_soft_tokens": 140}},
    ],
    ids=["70", "560", "nested-140"],
)
def test_a_request_s_budget_is_served_with_vllm_s_count(pair, reference, options):
    images = [make_image(1280, 960, seed=9), IMAGE]
    reply = ask(
        pair.gateway.client(), images, str(pair.model), extra_body={"mm_processor_kwargs": options}
    )
    assert reply.usage.prompt_tokens == len(
        vllm_prompt_ids(pair.model, images, options, max_model_len=ENGINE["max_model_len"])
    )
    assert reply.usage.completion_tokens == 10
    plain = ask(pair.gateway.client(), images, str(pair.model))
    assert reply.usage.prompt_tokens != plain.usage.prompt_tokens


def test_a_budget_vllm_refuses_is_a_400_naming_the_key(pair):
    from openai import BadRequestError

    with pytest.raises(BadRequestError) as refused:
        ask(
            pair.gateway.client(),
            [IMAGE],
            str(pair.model),
            extra_body={"mm_processor_kwargs": {"max_soft_tokens": 300}},
        )
    assert "mm_processor_kwargs.max_soft_tokens must be one of" in str(refused.value)


def test_a_placeholder_one_embedding_short_is_refused_by_the_worker(pair):
    assert_slot_check_refuses(pair)


def test_smg_drives_our_worker_with_it(pair, reference, tmp_path):
    """SMG 1.13 preprocesses Gemma 4 itself (router mode) and our worker takes its tensors."""
    from tests.support.smg import run_smg, smg_client

    with run_smg([pair.worker.address], tmp_path / "smg.log", "--mm-processing", "router") as base:
        client = smg_client(base)
        assert answers(client, client.models.list().data[0].id) == reference
