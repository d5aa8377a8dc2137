"""Qwen2.5-VL: videos (and images beside them) preprocessed by the gateway equal vLLM's own
OpenAI server on a tiny random-weight model: prompt tokens, greedy text and logprobs, where
`second_per_grid_ts` (temporal patch / sampled fps) moves the M-RoPE time axis, so a wrong
value changes the logprobs."""

from __future__ import annotations

import pytest

from tests.support.e2e_cases import IMAGE, png_bytes
from tests.support.family_e2e import serve_both
from tests.support.qwen25_vl_models import build_model
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

ENGINE = {"limit_mm_per_prompt": {"image": 1, "video": 2}}


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("clips")
    return {
        "odd": data_uri(make_clip(tmp, "a.avi", 17, (70, 94), 2.4, "MJPG", 1), "video/x-msvideo"),
        "7.5fps": data_uri(make_clip(tmp, "b.mp4", 24, (130, 90), 7.5, "mp4v", 2), "video/mp4"),
        "three": data_uri(make_clip(tmp, "c.mp4", 3, (64, 48), 3, "mp4v", 3), "video/mp4"),
    }


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen25vl")
    model = build_model(root / "model")
    with serve_both(model, root, **ENGINE) as pair:
        yield pair


CASES = {
    "odd-count": lambda c: [video(c["odd"]), text("Describe.")],
    "7.5fps-around-text": lambda c: [text("See"), video(c["7.5fps"]), text("What moves?")],
    "three-frames": lambda c: [video(c["three"])],
    "two-with-image": lambda c: [
        image(data_uri(png_bytes(IMAGE), "image/png")),
        video(c["odd"]),
        video(c["7.5fps"]),
    ],
}


@pytest.mark.parametrize("case", list(CASES))
def test_videos_equal_vllm_s_server(case, pair, clips):
    content = CASES[case](clips)
    want = chat(pair.vllm.base_url, REFERENCE_NAME, content)
    got = chat(pair.gateway.base_url, str(pair.model), content)
    assert_same_answer(got, want)


def test_a_video_placeholder_one_embedding_short_is_refused_by_the_worker(pair, clips):
    assert_short_video_refused(pair.model, pair.worker, clips["odd"])
