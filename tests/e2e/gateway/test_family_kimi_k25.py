"""Kimi-K2.5: images preprocessed by the gateway's Kimi-K2.5 family equal vLLM's own OpenAI
server on a tiny random-weight KimiK25ForConditionalGeneration (bfloat16, as vLLM runs its MLA
on a CPU; uint8 pixels, which vLLM normalizes on device for this model): the same prompt token
counts and greedy text. The model's one modality is vLLM's `vision_chunk` (its limit key);
the wire says IMAGE and our worker keys the items as vLLM does. The worker's slot check counts
grid_thws (vLLM's own rule needs the raw image) and refuses a placeholder one token short."""

from __future__ import annotations

import pytest

from tests.support.e2e_cases import IMAGE, make_image
from tests.support.family_e2e import CASES, assert_slot_check_refuses, serve_both
from tests.support.kimi_k25_models import build_model

ENGINE = {"dtype": "bfloat16", "limit_mm_per_prompt": {"vision_chunk": 2}}
# IMAGE's size, other pixels: the same prompt, so a different answer is the image's doing.
TWIN = make_image(IMAGE.width, IMAGE.height, seed=99)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("kimi_k25") / "model")


@pytest.fixture(scope="module")
def pair(model, tmp_path_factory):
    with serve_both(model, tmp_path_factory.mktemp("kimi_k25-logs"), **ENGINE) as pair:
        yield pair


@pytest.fixture(scope="module")
def reference(pair):
    return pair.reference([*CASES, ("twin", [TWIN])])


def test_the_gateway_has_this_family(model):
    from gateway.render.model_files import ModelFiles
    from multimodal.processors.kimi_k25 import KimiK25Processor
    from multimodal.registry import processors_for

    assert type(processors_for(ModelFiles.load(model)).get("image")) is KimiK25Processor


def test_images_equal_vllm_s_server(pair, reference):
    ours = pair.ours([*CASES, ("twin", [TWIN])])
    print("prompt_tokens:", {name: tokens for name, (tokens, _) in ours.items()})
    assert ours == reference
    # the gateway preprocessed them itself
    assert "no image processor here" not in pair.gateway.log_path.read_text()


def test_the_tiny_model_answers_varied_text_that_depends_on_the_image(reference):
    texts = [text for _, text in reference.values()]
    assert len(set(texts)) == len(texts) == len(CASES) + 1
    assert all(len(set(text)) > 8 for text in texts), texts
    # Same prompt length, other pixels, other answer.
    assert reference["twin"][0] == reference["one"][0]
    assert reference["twin"][1] != reference["one"][1]


def test_the_worker_reports_the_vision_chunk_limit_as_the_image_limit(pair):
    from protos import vllm_engine_pb2 as pb

    info = pair.worker.stub().GetServerInfo(pb.GetServerInfoRequest(), timeout=10)
    assert info.mm_device_do_normalize and info.multimodal_encoder_dtype == "bfloat16"
    assert "image=2" in info.mm_item_limits.split(",")


def test_three_images_are_refused_as_vllm_refuses_them(pair):
    import openai

    from tests.support.family_e2e import ask

    images = [IMAGE, TWIN, IMAGE]
    with pytest.raises(openai.BadRequestError) as theirs:
        ask(pair.vllm.client(), images, "tiny")
    with pytest.raises(openai.BadRequestError) as ours:
        ask(pair.gateway.client(), images, str(pair.model))
    assert "At most 2" in str(theirs.value) and "At most 2" in str(ours.value)


def test_a_placeholder_one_embedding_short_is_refused_by_the_worker(pair):
    assert_slot_check_refuses(pair)
