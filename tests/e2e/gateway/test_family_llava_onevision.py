"""LLaVA-OneVision: images preprocessed by the gateway's family (LLaVA-NeXT's anyres tiles with
OneVision's anyres_max_9 cap: 729 base tokens plus up to ~9 tiles' worth, each image of a
request tiled on its own as vLLM does) equal vLLM's own OpenAI server on a tiny random-weight
model: prompt token counts and greedy text. vLLM does not normalize this model's pixels on
device, so the gateway sends normalized float32. Prompts run to ~15,000 tokens for two large
images: max_model_len 16384.

Videos too (vLLM's default loader's 32 evenly spaced frames at most, each resized to 384x384
and normalized, 196 pooled tokens a frame plus a newline) equal vLLM's server: prompt tokens,
greedy text and logprobs. Videos of different lengths in one request, which kill vLLM's engine
core, are a 400. The video tests share the image tests' engines (each start costs ~30-40 s),
so both engines allow two videos beside the images; the limits are the same on vLLM's server
and our worker, so the image comparisons are unchanged."""

from __future__ import annotations

import pytest

from tests.support.e2e_cases import IMAGE, png_bytes
from tests.support.family_e2e import assert_slot_check_refuses, serve_both
from tests.support.llava_onevision_models import build_model
from tests.support.video_e2e import (
    REFERENCE_NAME,
    assert_same_answer,
    assert_short_video_refused,
    chat,
    data_uri,
    image,
    make_clip,
    text,
    video,
)

# A 32-frame video is 6,273 tokens; with a tiled image beside it prompts stay under 16384.
ENGINE = {"limit_mm_per_prompt": {"image": 2, "video": 2}, "max_model_len": 16384}


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


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("clips")
    return {
        "odd": data_uri(make_clip(tmp, "a.mp4", 10, (90, 66), 7.5, "mp4v", 1), "video/mp4"),
        "three": data_uri(make_clip(tmp, "b.avi", 3, (70, 94), 4, "MJPG", 2), "video/x-msvideo"),
        "long": data_uri(make_clip(tmp, "c.avi", 45, (122, 58), 24, "MJPG", 3), "video/x-msvideo"),
    }


CASES = {
    "odd-size": lambda c: [video(c["odd"]), text("Describe.")],
    "over-32-frames": lambda c: [text("See"), video(c["long"]), text("What moves?")],
    "two-of-one-length": lambda c: [video(c["odd"]), text("and"), video(c["odd"])],
    "with-image": lambda c: [image(data_uri(png_bytes(IMAGE), "image/png")), video(c["three"])],
}


@pytest.mark.parametrize("case", list(CASES))
def test_videos_equal_vllm_s_server(case, pair, clips):
    content = CASES[case](clips)
    want = chat(pair.vllm.base_url, REFERENCE_NAME, content)
    got = chat(pair.gateway.base_url, str(pair.model), content)
    assert_same_answer(got, want)


def test_videos_of_different_lengths_are_a_400(pair, clips):
    """vLLM's own server dies on them (its engine core: the model embeds them 3-D), so the
    gateway refuses them before they reach a worker."""
    content = [video(clips["three"]), video(clips["odd"]), text("Compare.")]
    reply = chat(pair.gateway.base_url, str(pair.model), content)
    assert reply.status_code == 400, reply.text
    assert "same number of frames" in reply.json()["error"]["message"]
    # and the worker still serves
    assert chat(pair.gateway.base_url, str(pair.model), [video(clips["odd"])]).status_code == 200


def test_a_video_placeholder_one_embedding_short_is_refused_by_the_worker(pair, clips):
    assert_short_video_refused(pair.model, pair.worker, clips["three"])
