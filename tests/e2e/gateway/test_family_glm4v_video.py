"""GLM-4.1V videos preprocessed by the gateway (multimodal.processors.glm4v_video) equal vLLM's
own OpenAI server on the tiny random-weight `glm4v` model: prompt tokens, greedy text and
logprobs. The gateway sends uint8 patches (vLLM normalizes GLM's pixels on device) and the
per-frame-pair timestamps in the prompt; clips take each of vLLM's paths (the loader's frames
at 7.5 fps, every frame kept so transformers samples again, a frame list). GLM-4.1V takes one
video a prompt."""

from __future__ import annotations

import httpx
import pytest

from tests.support.e2e_cases import IMAGE, png_bytes
from tests.support.family_e2e import serve_both
from tests.support.glm4v_models import build_model
from tests.support.video_e2e import (
    REFERENCE_NAME,
    assert_same_answer,
    assert_short_video_refused,
    chat,
    data_uri,
    image,
    jpeg_frames,
    make_clip,
    text,
    video,
)

ENGINE = {"limit_mm_per_prompt": {"image": 1, "video": 1}}


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


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("glm4v-video")
    with serve_both(build_model(root / "model", "glm4v"), root, **ENGINE) as pair:
        yield pair


CASES = {
    "7.5fps": lambda c: [video(c["7.5fps"]), text("Describe.")],
    "all-kept-around-text": lambda c: [text("See"), video(c["all-kept"]), text("What moves?")],
    "frame-list": lambda c: [video(c["frames"])],
    "with-image": lambda c: [image(data_uri(png_bytes(IMAGE), "image/png")), video(c["7.5fps"])],
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_video_equals_vllm_s_server(case, pair, clips):
    content = CASES[case](clips)
    want = chat(pair.vllm.base_url, REFERENCE_NAME, content)
    got = chat(pair.gateway.base_url, str(pair.model), content)
    assert_same_answer(got, want)


def processed_here(base_url: str) -> float:
    """How many requests' media the gateway preprocessed itself (the "process" stage)."""
    metrics = httpx.get(f"{base_url}/metrics", timeout=10).text
    prefix = 'mmgate_preprocess_duration_seconds_count{stage="process"} '
    return sum(
        float(line[len(prefix) :]) for line in metrics.splitlines() if line.startswith(prefix)
    )


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


def test_a_video_placeholder_one_embedding_short_is_refused_by_the_worker(pair, clips):
    assert_short_video_refused(pair.model, pair.worker, clips["7.5fps"])
