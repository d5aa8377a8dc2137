"""GLM-4.1V (`glm4v`, dense) and GLM-4.5V/4.6V (`glm4v_moe`): images preprocessed by the
gateway's GLM-4.xV family equal vLLM's own OpenAI server on tiny random-weight models (prompt
token counts and greedy text; uint8 patches, as vLLM normalizes GLM pixels on device); a
per-request `size` is served with vLLM's own count; and the worker's slot check (vLLM's own
rule, t*h*w / merge^2 from `image_grid_thw`) refuses a placeholder one `<|image|>` short.

SMG 1.13 has no router-side GLM-4.xV processor (its only GLM vision spec is GLM-5.3-Flash's;
in router or auto mode it answers 400 "no media spec for its family"), so there is no SMG case
here.
"""

from __future__ import annotations

import openai
import pytest

from tests.support.e2e_cases import IMAGE, make_image
from tests.support.family_e2e import ask, assert_slot_check_refuses, serve_both, vllm_prompt_ids
from tests.support.glm4v_models import TINY_PIXELS, build_model

ENGINE = {"limit_mm_per_prompt": {"image": 2}}
SMALLER = {"size": {**TINY_PIXELS, "longest_edge": 2 * 28 * 28 * 16}}  # 16 tokens at most
# The same size as IMAGE, other pixels: the same prompt, so only the image can change the text.
OTHER = make_image(*IMAGE.size, seed=99)


@pytest.fixture(scope="module", params=["glm4v", "glm4v_moe"])
def pair(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    with serve_both(build_model(root / "model", request.param), root, **ENGINE) as pair:
        yield pair


@pytest.fixture(scope="module")
def reference(pair):
    return pair.reference()


def test_the_gateway_has_this_family_and_sends_uint8(pair):
    from gateway.render.model_files import ModelFiles
    from multimodal.processors.glm4v import Glm4vProcessor
    from multimodal.registry import processors_for
    from protos import vllm_engine_pb2 as pb

    assert type(processors_for(ModelFiles.load(pair.model)).get("image")) is Glm4vProcessor
    # vLLM's default for GLM: it normalizes on device, so the gateway sends uint8 patches.
    info = pair.worker.stub().GetServerInfo(pb.GetServerInfoRequest(), timeout=10)
    assert info.mm_device_do_normalize


def test_images_equal_vllm_s_server(pair, reference):
    assert pair.ours() == reference
    # the gateway preprocessed them itself
    assert "no image processor here" not in pair.gateway.log_path.read_text()


def test_the_answer_depends_on_the_image(pair, reference):
    texts = [text for _, text in reference.values()]
    assert len(set(texts)) == len(texts)
    assert all(len(set(text)) > 8 for text in texts), texts
    one, other = (ask(pair.gateway.client(), [i], str(pair.model)) for i in (IMAGE, OTHER))
    assert one.usage.prompt_tokens == other.usage.prompt_tokens
    assert one.choices[0].message.content != other.choices[0].message.content


def test_a_per_request_size_is_served_with_vllm_s_count(pair):
    images = [make_image(640, 480, seed=3), IMAGE]
    client = pair.gateway.client()
    reply = ask(client, images, str(pair.model), extra_body={"mm_processor_kwargs": SMALLER})
    assert reply.usage.prompt_tokens == len(vllm_prompt_ids(pair.model, images, SMALLER))
    assert reply.usage.completion_tokens == 10
    plain = ask(client, images, str(pair.model))
    assert reply.usage.prompt_tokens < plain.usage.prompt_tokens


def test_qwen_s_pixel_options_are_refused_by_name(pair):
    with pytest.raises(openai.BadRequestError) as refused:
        ask(
            pair.gateway.client(),
            [IMAGE],
            str(pair.model),
            extra_body={"mm_processor_kwargs": {"max_pixels": 28 * 28 * 16}},
        )
    assert "max_pixels" in str(refused.value)


def test_a_placeholder_one_embedding_short_is_refused_by_the_worker(pair):
    assert_slot_check_refuses(pair)
