"""LLaVA-OneVision videos preprocessed by the gateway (multimodal.processors.llava_onevision:
vLLM's default loader's 32 evenly spaced frames at most, each resized to 384x384 and
normalized, 196 pooled tokens a frame plus a newline) equal vLLM's own OpenAI server on the
tiny random-weight model: prompt tokens, greedy text and logprobs. Videos of different
lengths in one request, which kill vLLM's engine core, are a 400."""

from __future__ import annotations

import pytest

from tests.support.e2e_cases import IMAGE, png_bytes
from tests.support.family_e2e import serve_both
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
ENGINE = {"limit_mm_per_prompt": {"image": 1, "video": 2}, "max_model_len": 16384}


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("clips")
    return {
        "odd": data_uri(make_clip(tmp, "a.mp4", 10, (90, 66), 7.5, "mp4v", 1), "video/mp4"),
        "three": data_uri(make_clip(tmp, "b.avi", 3, (70, 94), 4, "MJPG", 2), "video/x-msvideo"),
        "long": data_uri(make_clip(tmp, "c.avi", 45, (122, 58), 24, "MJPG", 3), "video/x-msvideo"),
    }


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("onevision-video")
    with serve_both(build_model(root / "model"), root, **ENGINE) as pair:
        yield pair


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
