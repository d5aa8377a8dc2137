"""The Qwen3-VL video e2e cases, shared by the Qwen3-VL module (test_family_qwen3_vl_video) and
the Qwen3.5 one (test_family_qwen35, whose image engines they reuse): the clips, the requests
made of them, and the comparison of one request through a gateway that preprocesses it itself
(`--mm-processing gateway`) with vLLM's own server."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.support.e2e_cases import IMAGE, png_bytes
from tests.support.family_e2e import Pair
from tests.support.video_e2e import (
    REFERENCE_NAME,
    assert_same_answer,
    chat,
    data_uri,
    image,
    jpeg_frames,
    make_clip,
    processed_here,
    text,
    video,
)

GATEWAY_ARGS = ("--mm-processing", "gateway")  # a video it could not preprocess: a 400
LIMITS = {"image": 1, "video": 2}  # at least these on both engines


def make_clips(tmp: Path) -> dict[str, str]:
    return {
        # 7 frames kept of 25: an odd count, its last frame repeated
        "mp4": data_uri(make_clip(tmp, "a.mp4", 25, (90, 66), 7, "mp4v", 1), "video/mp4"),
        # 3 frames: every one kept
        "avi": data_uri(make_clip(tmp, "b.avi", 3, (70, 94), 4, "MJPG", 2), "video/x-msvideo"),
        "thirds": data_uri(make_clip(tmp, "c.mp4", 45, (64, 48), 30, "mp4v", 3), "video/mp4"),
        "frames": jpeg_frames(4, (64, 48), 4),
    }


CASES: dict[str, Callable[[dict[str, str]], list[dict]]] = {
    "alone": lambda c: [video(c["mp4"]), text("Describe.")],
    "around-text": lambda c: [text("First this:"), video(c["avi"]), text("What moves?")],
    "thirds-of-a-second": lambda c: [video(c["thirds"]), text("Describe.")],
    "frame-list": lambda c: [video(c["frames"]), text("Describe.")],
    "with-image": lambda c: [image(data_uri(png_bytes(IMAGE), "image/png")), video(c["mp4"])],
    "two-videos": lambda c: [video(c["avi"]), text("and"), video(c["thirds"]), text("Compare.")],
}


def assert_preprocessed_here_equals_vllm(pair: Pair, content: list[dict]) -> None:
    """The same answer as vLLM's server, the media preprocessed by the gateway itself."""
    want = chat(pair.vllm.base_url, REFERENCE_NAME, content)
    before = processed_here(pair.gateway.base_url)
    got = chat(pair.gateway.base_url, str(pair.model), content)
    assert_same_answer(got, want)
    assert processed_here(pair.gateway.base_url) - before == 1  # by the gateway itself


def answer_texts(pair: Pair, clips: dict[str, str]) -> list[str]:
    """The gateway's greedy text for two different clips ("mp4", "thirds")."""
    replies = [
        chat(pair.gateway.base_url, str(pair.model), [video(clips[name]), text("Describe.")])
        for name in ("mp4", "thirds")
    ]
    return [r.json()["choices"][0]["message"]["content"] for r in replies]
