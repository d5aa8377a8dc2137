"""GLM-4.1V (`glm4v`, dense) and GLM-4.5V/4.6V (`glm4v_moe`): images preprocessed by the
gateway's GLM-4.xV family equal vLLM's own OpenAI server on tiny random-weight models (prompt
token counts and greedy text; uint8 patches, as vLLM normalizes GLM pixels on device); a
per-request `size` is served with vLLM's own count; and the worker's slot check (vLLM's own
rule, t*h*w / merge^2 from `image_grid_thw`) refuses a placeholder one `<|image|>` short.

GLM-4.1V videos preprocessed by the gateway (multimodal.processors.glm4v_video) equal vLLM's
server too on the `glm4v` model: prompt tokens, greedy text and logprobs. The gateway sends
the per-frame-pair timestamps in the prompt; clips take each of vLLM's paths (the loader's
frames at 7.5 fps, every frame kept so transformers samples again, a frame list). GLM-4.1V
takes one video a prompt. The video tests share the image tests' engines (one vLLM server and
one worker a model: each start costs ~30-40 s), so the engines allow a video beside the
images; both engines get the same limits, so the image comparisons are unchanged.

SMG 1.13 has no router-side GLM-4.xV processor (its only GLM vision spec is GLM-5.3-Flash's;
in router or auto mode it answers 400 "no media spec for its family"), so there is no SMG case
here.
"""

from __future__ import annotations

import openai
import pytest

from tests.support.e2e_cases import IMAGE, make_image, png_bytes
from tests.support.family_e2e import ask, assert_slot_check_refuses, serve_both, vllm_prompt_ids
from tests.support.glm4v_models import TINY_PIXELS, build_model
from tests.support.video_e2e import (
    REFERENCE_NAME,
    assert_same_answer,
    assert_short_video_refused,
    chat,
    data_uri,
    image,
    jpeg_frames,
    make_clip,
    processed_here,
    text,
    video,
)

ENGINE = {"limit_mm_per_prompt": {"image": 2, "video": 1}}
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


# The video tests run on the dense model only: the same pair as the image tests' "glm4v".
ON_GLM4V = pytest.mark.parametrize("pair", ["glm4v"], indirect=True)


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("clips")
    return {
        "7.5fps": data_uri(make_clip(tmp, "a.mp4", 24, (130, 90), 7.5, "mp4v", 1), "video/mp4"),
        "all-kept": data_uri(
            make_clip(tmp, "b.avi", 5, (170, 138), 2, "MJPG", 2), "video/x-msvideo"
        ),
        "frames": jpeg_frames(5, (64, 48), 3),
    }


CASES = {
    "7.5fps": lambda c: [video(c["7.5fps"]), text("Describe.")],
    "all-kept-around-text": lambda c: [text("See"), video(c["all-kept"]), text("What moves?")],
    "frame-list": lambda c: [video(c["frames"])],
    "with-image": lambda c: [image(data_uri(png_bytes(IMAGE), "image/png")), video(c["7.5fps"])],
}


@ON_GLM4V
@pytest.mark.parametrize("case", list(CASES))
def test_a_video_equals_vllm_s_server(case, pair, clips):
    content = CASES[case](clips)
    want = chat(pair.vllm.base_url, REFERENCE_NAME, content)
    got = chat(pair.gateway.base_url, str(pair.model), content)
    assert_same_answer(got, want)


@ON_GLM4V
def test_the_gateway_preprocesses_the_videos_itself(pair, clips):
    from gateway.render.model_files import ModelFiles
    from multimodal.processors.glm4v_video import Glm4vVideoProcessor
    from multimodal.registry import processors_for

    files = ModelFiles.load(pair.model)
    assert type(processors_for(files).get("video")) is Glm4vVideoProcessor
    before = processed_here(pair.gateway.base_url)
    reply = chat(pair.gateway.base_url, str(pair.model), [video(clips["7.5fps"])])
    assert reply.status_code == 200, reply.text
    assert processed_here(pair.gateway.base_url) - before == 1


@ON_GLM4V
def test_a_video_placeholder_one_embedding_short_is_refused_by_the_worker(pair, clips):
    assert_short_video_refused(pair.model, pair.worker, clips["7.5fps"])
