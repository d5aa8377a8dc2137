"""Qwen2-Audio and Qwen2.5-Omni (its thinker): clips preprocessed by the gateway
(`--mm-processing gateway`: decoded, resampled and turned into features here, sent to
`mmgate engine` as mm_inputs) answer as vLLM's own OpenAI server on the same tiny random-weight
model: the same prompt tokens (/tokenize: the ids themselves), greedy text and each token's
logprob within 1e-4, for a clip alone, with text, two per prompt (one cut at 30 s by
Qwen2-Audio and not by Omni), over two turns and (Omni) beside an image. The same chats through
the worker fallback (`--mm-processing worker`: the clips checked here and forwarded as
media_refs, vLLM's processor run in the worker) by a second gateway in front of the same
`mmgate engine --mm-processor inprocess`. One family's servers run at a time."""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.support import qwen2_audio_models, qwen25_omni_models
from tests.support.audio_e2e import answer, assert_same_answer, clip, input_audio
from tests.support.e2e_cases import IMAGE, png_bytes
from tests.support.family_e2e import REFERENCE_NAME, serve_both
from tests.support.gateway_process import GatewayProcess

# vLLM profiles with `limit` clips of 30 s (750 tokens each): two need a context above 1500.
FAMILIES: dict[str, tuple[Callable[[Path], Path], dict]] = {
    "qwen2_audio": (
        qwen2_audio_models.build_model,
        {"max_model_len": 2048, "limit_mm_per_prompt": {"audio": 2}},
    ),
    "qwen25_omni": (
        qwen25_omni_models.build_model,
        {"max_model_len": 2048, "limit_mm_per_prompt": {"audio": 2, "image": 1, "video": 0}},
    ),
}

SHORT = input_audio(clip(0.2, 24000, 2, seed=1))  # 5 tokens, resampled, stereo
MID = input_audio(clip(5.0, 44100, 1, "FLAC", seed=2), "wav")
LONG = input_audio(clip(31.0, 16000, seed=3))  # 750 tokens (Qwen2-Audio) or 775 (Omni)
IMAGE_PART = {
    "type": "image_url",
    "image_url": {"url": "data:image/png;base64," + base64.b64encode(png_bytes(IMAGE)).decode()},
}


def user(*parts: dict) -> dict:
    return {"role": "user", "content": list(parts)}


def text(value: str) -> dict:
    return {"type": "text", "text": value}


CASES: dict[str, list[dict]] = {
    "alone": [user(MID)],
    "with-text": [user(text("Listen:"), SHORT, text("What is it?"))],
    "two-per-prompt": [user(LONG, SHORT, text("Compare them."))],
    "two-turns": [
        user(SHORT, text("What is it?")),
        {"role": "assistant", "content": "A tone."},
        user(MID, text("And this one?")),
    ],
}
OMNI_CASES: dict[str, list[dict]] = {
    "with-image": [user(IMAGE_PART, MID, text("Describe both."))],
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def pair(request, tmp_path_factory):
    build, engine = FAMILIES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    model = build(root / "model")
    inprocess = {"mm_processor": "inprocess"}
    with serve_both(
        model, root, "--mm-processing", "gateway", worker_extra=inprocess, **engine
    ) as pair:
        yield request.param, pair


@pytest.fixture(scope="module")
def fallback(pair, tmp_path_factory):
    """A gateway leaving the clips to the same worker's in-process vLLM processor."""
    family, both = pair
    logs = tmp_path_factory.mktemp(f"{family}-fallback")
    gateway = GatewayProcess(
        both.model, [both.worker.address], logs / "gateway.log", "--mm-processing", "worker"
    )
    try:
        yield gateway.wait_ready()
    finally:
        gateway.stop()


def cases_for(family: str) -> dict[str, list[dict]]:
    return {**CASES, **(OMNI_CASES if family == "qwen25_omni" else {})}


def test_chats_equal_vllm_s_server(pair):
    family, both = pair
    for name, messages in cases_for(family).items():
        want = answer(both.vllm.base_url, REFERENCE_NAME, messages)
        got = answer(both.gateway.base_url, str(both.model), messages)
        try:
            assert_same_answer(got, want)
        except AssertionError as error:
            raise AssertionError(f"{family} {name}: {error}") from error


def test_worker_fallback_equals_vllm_s_server(pair, fallback):
    family, both = pair
    for name, messages in cases_for(family).items():
        want = answer(both.vllm.base_url, REFERENCE_NAME, messages)
        got = answer(fallback.base_url, str(both.model), messages)
        try:
            assert_same_answer(got, want)
        except AssertionError as error:
            raise AssertionError(f"{family} {name} (worker fallback): {error}") from error


def test_prompt_ids_equal_vllm_s_server(pair):
    """The expanded prompt itself, for the case with the most placeholders."""
    family, both = pair
    name = "with-image" if family == "qwen25_omni" else "two-per-prompt"
    messages = cases_for(family)[name]
    want = httpx.post(
        f"{both.vllm.base_url}/tokenize",
        json={"model": REFERENCE_NAME, "messages": messages},
        timeout=300,
    )
    got = httpx.post(
        f"{both.gateway.base_url}/tokenize",
        json={"model": str(both.model), "messages": messages},
        timeout=300,
    )
    assert want.status_code == 200, want.text
    assert got.status_code == 200, got.text
    assert got.json()["tokens"] == want.json()["tokens"]
