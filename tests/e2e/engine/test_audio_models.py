"""vLLM's own OpenAI server serves the tiny audio models the issue-30 tests run against.

Qwen2-Audio and Qwen2.5-Omni (its thinker) take `input_audio` chat parts: the prompt vLLM runs
is the model's chat template with its one audio token repeated once per audio feature,
((L-1)//2+1-2)//2+1 of them for L = ceil(samples at 16 kHz / 160) mel frames. Past 30 s
Qwen2-Audio's processor cuts the features at 3000 frames (750 tokens); Omni's feature extractor
pads to 300 s, so a 31 s clip keeps all 775. Whisper answers /v1/audio/transcriptions.
"""

from __future__ import annotations

import base64
import io
import math
import wave
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import httpx
import numpy as np
import pytest

from tests.support import qwen2_audio_models, qwen25_omni_models, whisper_models
from tests.support.engines import VllmServerProcess

pytestmark = pytest.mark.slow  # also implied by tests/e2e; said here for a reader

# vLLM's profiling run feeds `limit` audios of 30 s each (750 tokens apiece) through the model,
# so two audios per prompt need a max model len above 1500.
CHAT_SERVER_ARGS = {"max_model_len": 2048, "limit_mm_per_prompt": {"audio": 2}}
CHAT_MODELS: dict[str, tuple[Callable[[Path], Path], str]] = {
    "qwen2_audio": (qwen2_audio_models.build_model, qwen2_audio_models.AUDIO),
    "qwen25_omni": (qwen25_omni_models.build_model, qwen25_omni_models.AUDIO),
}
QUESTION = "What is this?"


def wav_bytes(seconds: float, rate: int = 16000, seed: int = 0) -> bytes:
    """A 16-bit mono WAV of a 440 Hz tone under a little noise (numpy and the stdlib only)."""
    rng = np.random.default_rng(seed)
    t = np.arange(round(seconds * rate)) / rate
    signal = 0.3 * np.sin(2 * np.pi * 440 * t) + 0.05 * rng.standard_normal(t.size)
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes((np.clip(signal, -1, 1) * 32767).astype("<i2").tobytes())
    return buffer.getvalue()


def audio_tokens(samples_16k: int) -> int:
    """The issue's count of audio placeholder tokens for a clip of this many 16 kHz samples."""
    frames = math.ceil(samples_16k / 160)
    return ((frames - 1) // 2 + 1 - 2) // 2 + 1


def audio_part(seconds: float, rate: int = 16000, seed: int = 0) -> dict:
    data = base64.b64encode(wav_bytes(seconds, rate, seed)).decode()
    return {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}


class ChatServer(NamedTuple):
    name: str
    model: Path
    server: VllmServerProcess


@pytest.fixture(scope="module", params=sorted(CHAT_MODELS))
def chat_server(request, tmp_path_factory) -> Iterator[ChatServer]:
    """One model's directory served by vLLM at a time (the machine has two cores)."""
    name = request.param
    build, _ = CHAT_MODELS[name]
    model = build(tmp_path_factory.mktemp(name))
    logs = tmp_path_factory.mktemp("logs")
    server = VllmServerProcess(model, logs / f"{name}.log", **CHAT_SERVER_ARGS)
    try:
        yield ChatServer(name, model, server.wait_ready())
    finally:
        server.stop()


def chat(server: VllmServerProcess, content: list[dict]) -> dict:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 4,
        "temperature": 0,
        "return_token_ids": True,
    }
    reply = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


def expected_prompt(model_dir: Path, audio_token: str, counts: list[int]) -> list[int]:
    """The model's template rendered by transformers with one audio part per count (then the
    question), each audio token repeated `count` times."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    parts = [{"type": "audio"} for _ in counts] + [{"type": "text", "text": QUESTION}]
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": parts}], add_generation_prompt=True, tokenize=False
    )
    ids = tokenizer.encode(text, add_special_tokens=False)
    audio_id = tokenizer.convert_tokens_to_ids(audio_token)
    expanded, pending = [], iter(counts)
    for token in ids:
        expanded += [audio_id] * next(pending) if token == audio_id else [token]
    return expanded


@pytest.mark.parametrize(
    ("seconds", "rate"), [(2.0, 16000), (0.2, 16000), (2.0, 44100), (31.0, 16000)]
)
def test_chat_prompt_has_the_audio_tokens(chat_server, seconds, rate):
    name, model_dir, server = chat_server
    reply = chat(server, [audio_part(seconds, rate), {"type": "text", "text": QUESTION}])
    count = audio_tokens(math.ceil(seconds * 16000))
    if name == "qwen2_audio":
        count = min(count, 750)  # features cut at 30 s
    _, audio_token = CHAT_MODELS[name]
    assert reply["prompt_token_ids"] == expected_prompt(model_dir, audio_token, [count])
    assert reply["usage"]["prompt_tokens"] == len(reply["prompt_token_ids"])
    assert reply["choices"][0]["message"]["content"]  # the model answered


def test_chat_two_audios_in_one_prompt(chat_server):
    name, model_dir, server = chat_server
    content = [audio_part(2.0), audio_part(1.0, seed=1), {"type": "text", "text": QUESTION}]
    reply = chat(server, content)
    _, audio_token = CHAT_MODELS[name]
    expected = expected_prompt(model_dir, audio_token, [audio_tokens(32000), audio_tokens(16000)])
    assert reply["prompt_token_ids"] == expected


def test_chat_answer_depends_on_the_audio(chat_server):
    # Random weights, but wide ones: a different clip moves the first token's logprobs.
    server = chat_server.server

    def first_logprob(seed: int) -> float:
        body = {
            "model": "tiny",
            "messages": [{"role": "user", "content": [audio_part(2.0, seed=seed)]}],
            "max_tokens": 1,
            "temperature": 0,
            "logprobs": True,
        }
        reply = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=120)
        assert reply.status_code == 200, reply.text
        return reply.json()["choices"][0]["logprobs"]["content"][0]["logprob"]

    assert first_logprob(0) != first_logprob(1)


@pytest.fixture(scope="module")
def whisper_server(tmp_path_factory) -> Iterator[VllmServerProcess]:
    model = whisper_models.build_model(tmp_path_factory.mktemp("whisper"))
    logs = tmp_path_factory.mktemp("logs")
    server = VllmServerProcess(model, logs / "whisper.log", max_model_len=448)
    try:
        yield server.wait_ready()
    finally:
        server.stop()


@pytest.mark.parametrize("language", ["en", None])  # None: vLLM's language-detection pass
def test_whisper_transcribes(whisper_server, language):
    data = {"model": "tiny", "response_format": "json", "max_completion_tokens": "16"}
    if language:
        data["language"] = language
    files = {"file": ("clip.wav", wav_bytes(2.5, 44100), "audio/wav")}
    reply = httpx.post(
        f"{whisper_server.base_url}/v1/audio/transcriptions", files=files, data=data, timeout=120
    )
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert isinstance(body["text"], str) and body["text"]
    assert body["usage"] == {"type": "duration", "seconds": 3}  # ceil(2.5 s)


def test_whisper_serves_no_chat(whisper_server):
    body = {"model": "tiny", "messages": [{"role": "user", "content": [audio_part(1.0)]}]}
    reply = httpx.post(f"{whisper_server.base_url}/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 404
