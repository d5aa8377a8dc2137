"""Qwen3-VL and Qwen3.5 videos preprocessed by the gateway (multimodal/processors/
qwen3_vl_video.py) equal vLLM's own OpenAI server on tiny random-weight models: the same prompt
token counts, greedy text, tokens and logprobs. The gateway runs with `--mm-processing
gateway`, so a video it could not preprocess itself would be a 400, not a worker fallback."""

from __future__ import annotations

import pytest

from tests.support import qwen3_vl_models, qwen35_models
from tests.support.e2e_cases import IMAGE, png_bytes
from tests.support.family_e2e import serve_both
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

LIMITS = {"image": 1, "video": 2}
MODELS = {
    # name: (builder, engine dtype): vLLM runs Qwen3.5 on a CPU in bfloat16 only
    "qwen3_vl": (qwen3_vl_models.build_model, "float32"),
    "qwen3_5": (qwen35_models.build_model, "bfloat16"),
}


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("clips")
    return {
        # 7 frames kept of 25: an odd count, its last frame repeated
        "mp4": data_uri(make_clip(tmp, "a.mp4", 25, (90, 66), 7, "mp4v", 1), "video/mp4"),
        # 3 frames: every one kept
        "avi": data_uri(make_clip(tmp, "b.avi", 3, (70, 94), 4, "MJPG", 2), "video/x-msvideo"),
        "thirds": data_uri(make_clip(tmp, "c.mp4", 45, (64, 48), 30, "mp4v", 3), "video/mp4"),
        "frames": jpeg_frames(4, (64, 48), 4),
    }


@pytest.fixture(scope="module", params=list(MODELS))
def pair(request, tmp_path_factory):
    build, dtype = MODELS[request.param]
    root = tmp_path_factory.mktemp(f"{request.param}-video")
    model = build(root / "model")
    engine = {"dtype": dtype, "limit_mm_per_prompt": LIMITS}
    with serve_both(model, root, "--mm-processing", "gateway", **engine) as pair:
        yield pair


CASES = {
    "alone": lambda c: [video(c["mp4"]), text("Describe.")],
    "around-text": lambda c: [text("First this:"), video(c["avi"]), text("What moves?")],
    "thirds-of-a-second": lambda c: [video(c["thirds"]), text("Describe.")],
    "frame-list": lambda c: [video(c["frames"]), text("Describe.")],
    "with-image": lambda c: [image(data_uri(png_bytes(IMAGE), "image/png")), video(c["mp4"])],
    "two-videos": lambda c: [video(c["avi"]), text("and"), video(c["thirds"]), text("Compare.")],
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_video_preprocessed_by_the_gateway_equals_vllm_s_server(case, clips, pair):
    content = CASES[case](clips)
    want = chat(pair.vllm.base_url, REFERENCE_NAME, content)
    before = processed_here(pair.gateway.base_url)
    got = chat(pair.gateway.base_url, str(pair.model), content)
    assert_same_answer(got, want)
    assert processed_here(pair.gateway.base_url) - before == 1  # by the gateway itself


def test_the_answers_follow_the_video(clips, pair):
    """The tiny models' text depends on the frames, so the comparisons above see them."""
    replies = [
        chat(pair.gateway.base_url, str(pair.model), [video(clips[name]), text("Describe.")])
        for name in ("mp4", "thirds")
    ]
    texts = [r.json()["choices"][0]["message"]["content"] for r in replies]
    assert texts[0] != texts[1]
