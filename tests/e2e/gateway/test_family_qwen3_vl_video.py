"""Qwen3-VL videos preprocessed by the gateway (multimodal/processors/qwen3_vl_video.py) equal
vLLM's own OpenAI server on a tiny random-weight model: the same prompt token counts, greedy
text, tokens and logprobs. The gateway runs with `--mm-processing gateway`, so a video it could
not preprocess itself would be a 400, not a worker fallback. Qwen3.5's run of the same cases is
in test_family_qwen35.py, on the engines of its image tests."""

from __future__ import annotations

import pytest

from tests.support import qwen3_vl_models
from tests.support.family_e2e import serve_both
from tests.support.qwen3_vl_video_e2e import (
    CASES,
    GATEWAY_ARGS,
    LIMITS,
    answer_texts,
    assert_preprocessed_here_equals_vllm,
    make_clips,
)


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, str]:
    return make_clips(tmp_path_factory.mktemp("clips"))


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen3_vl-video")
    model = qwen3_vl_models.build_model(root / "model")
    engine = {"dtype": "float32", "limit_mm_per_prompt": LIMITS}
    with serve_both(model, root, *GATEWAY_ARGS, **engine) as pair:
        yield pair


@pytest.mark.parametrize("case", list(CASES))
def test_a_video_preprocessed_by_the_gateway_equals_vllm_s_server(case, clips, pair):
    assert_preprocessed_here_equals_vllm(pair, CASES[case](clips))


def test_the_answers_follow_the_video(clips, pair):
    """The tiny model's text depends on the frames, so the comparisons above see them."""
    texts = answer_texts(pair, clips)
    assert texts[0] != texts[1]
