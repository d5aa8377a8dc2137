"""Audio chats for end-to-end tests: clips made here, `input_audio` parts, and the comparison
of two servers' answers (prompt tokens, greedy text, each token's logprob and top tokens)."""

from __future__ import annotations

import base64
import io
from typing import Any

import httpx
import numpy as np

from tests.support.audio_refs import require

LOGPROB_TOLERANCE = 1e-4


def clip(
    seconds: float, rate: int = 16000, channels: int = 1, fmt: str = "WAV", seed: int = 0
) -> bytes:
    """A tone (a different pitch per channel) under a little noise, in `fmt`."""
    soundfile = require("soundfile")
    t = np.arange(round(seconds * rate)) / rate
    tones = [0.3 * np.sin(2 * np.pi * (220 + 110 * k) * t) for k in range(channels)]
    samples = np.stack(tones, axis=1)
    samples += 0.03 * np.random.default_rng(seed).standard_normal(samples.shape)
    buffer = io.BytesIO()
    subtype = {"MP3": "MPEG_LAYER_III", "OGG": "VORBIS"}.get(fmt)
    soundfile.write(buffer, samples.astype(np.float32), rate, format=fmt, subtype=subtype)
    return buffer.getvalue()


def input_audio(raw: bytes, declared: str = "wav") -> dict:
    data = base64.b64encode(raw).decode()
    return {"type": "input_audio", "input_audio": {"data": data, "format": declared}}


def chat(base_url: str, model: str, messages: list[dict], **extra: Any) -> httpx.Response:
    """A greedy chat of 8 tokens with logprobs (EOS ignored, so the length never depends on
    it)."""
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": 8,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
        "ignore_eos": True,
        **extra,
    }
    return httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=300)


def answer(base_url: str, model: str, messages: list[dict]) -> dict:
    reply = chat(base_url, model, messages)
    assert reply.status_code == 200, reply.text
    return reply.json()


def assert_same_answer(ours: dict, reference: dict) -> None:
    assert ours["usage"]["prompt_tokens"] == reference["usage"]["prompt_tokens"]
    got, want = ours["choices"][0], reference["choices"][0]
    assert got["message"]["content"] == want["message"]["content"]
    got_tokens, want_tokens = got["logprobs"]["content"], want["logprobs"]["content"]
    assert [t["token"] for t in got_tokens] == [t["token"] for t in want_tokens]
    for g, w in zip(got_tokens, want_tokens, strict=True):
        assert abs(g["logprob"] - w["logprob"]) <= LOGPROB_TOLERANCE, (g, w)
        assert [t["token"] for t in g["top_logprobs"]] == [t["token"] for t in w["top_logprobs"]]
