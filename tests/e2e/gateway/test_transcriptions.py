"""/v1/audio/transcriptions and /translations through the gateway answer as vLLM 0.32's own
server does, on the tiny random-weight Whisper, with the openai SDK as the client: the gateway
decodes and cuts the audio, a worker (`mmgate engine --mm-processor inprocess`) runs vLLM's
Whisper processor on each clip. Equal text for a short clip and for one past 30 s (two clips),
with and without a language (vLLM's detection pass), with a prompt, in every response format
vLLM answers (srt and vtt are 400s on both), streamed; bad audio is a 400 on both and the
gateway keeps serving."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import NamedTuple

import openai
import pytest

from tests.e2e.engine.test_audio_models import wav_bytes
from tests.support import whisper_models
from tests.support.engines import VllmServerProcess, WorkerProcess
from tests.support.gateway_process import GatewayProcess

# Whisper's decoder context is 448 tokens; a few generated tokens keep the module short.
MAX_TOKENS = {"max_completion_tokens": 12}
# verbose_json: enough for the random model to close a segment with a pair of timestamps.
VERBOSE_TOKENS = {"max_completion_tokens": 48}
SHORT = ("short.wav", wav_bytes(2.5, 44100))  # resampled by libswresample on both sides
LONG = ("long.wav", wav_bytes(31.0, 16000, seed=3))  # two clips, cut near 30 s


class Servers(NamedTuple):
    vllm: openai.OpenAI
    gateway: openai.OpenAI


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[Servers]:
    model = whisper_models.build_model(tmp_path_factory.mktemp("whisper"))
    logs = tmp_path_factory.mktemp("asr-logs")
    reference = VllmServerProcess(model, logs / "vllm.log", max_model_len=448)
    worker = WorkerProcess(model, logs / "engine.log", max_model_len=448, mm_processor="inprocess")
    gateway = None
    try:
        worker.wait_ready()
        gateway = GatewayProcess(
            model, [worker.address], logs / "gateway.log", "--served-model-name", "tiny"
        ).wait_ready()
        yield Servers(reference.wait_ready().client(), gateway.client())
    finally:
        if gateway is not None:
            gateway.stop()
        worker.stop()
        reference.stop()


def _both(servers: Servers, call) -> tuple[object, object]:
    return call(servers.vllm), call(servers.gateway)


def _plain(reply: object) -> object:
    # response_format "text": vLLM answers JSON anyway, which the SDK hands back as a string.
    return json.loads(reply) if isinstance(reply, str) else reply.model_dump()


@pytest.mark.parametrize(
    ("audio", "language", "response_format"),
    [
        (SHORT, "en", "json"),
        (SHORT, None, "json"),
        (SHORT, "en", "text"),
        (SHORT, "en", "verbose_json"),
        (LONG, "en", "json"),
        (LONG, None, "verbose_json"),
    ],
    ids=["json", "detected", "text", "verbose", "long", "long-verbose-detected"],
)
def test_transcription_equals_vllm(servers, audio, language, response_format):
    def call(client: openai.OpenAI):
        extra = {"language": language} if language else {}
        return client.audio.transcriptions.create(
            model="tiny",
            file=audio,
            response_format=response_format,
            extra_body={**(VERBOSE_TOKENS if verbose else MAX_TOKENS), **extra},
        )

    verbose = response_format == "verbose_json"
    theirs, ours = map(_plain, _both(servers, call))
    assert ours == theirs
    assert theirs["segments"] if verbose else theirs["text"]  # saying nothing proves nothing
    if not verbose:
        assert theirs["usage"] == {"type": "duration", "seconds": 31 if audio is LONG else 3}


def test_prompt_and_temperature_equal_vllm(servers):
    def call(client: openai.OpenAI):
        return client.audio.transcriptions.create(
            model="tiny",
            file=SHORT,
            language="de",
            prompt="Guten Tag",
            temperature=0.7,
            extra_body={**MAX_TOKENS, "seed": 7},
        )

    theirs, ours = map(_plain, _both(servers, call))
    assert ours == theirs


@pytest.mark.parametrize("language", ["en", None])
def test_translation_equals_vllm(servers, language):
    def call(client: openai.OpenAI):
        extra = {"language": language} if language else {}
        return client.audio.translations.create(
            model="tiny", file=LONG, extra_body={**MAX_TOKENS, **extra}
        )

    theirs, ours = map(_plain, _both(servers, call))
    assert ours == theirs and set(theirs) == {"text"}


def test_stream_equals_vllm(servers):
    def call(client: openai.OpenAI) -> tuple[str, list, dict]:
        events = client.audio.transcriptions.create(
            model="tiny",
            file=LONG,
            language="en",
            stream=True,
            extra_body={**MAX_TOKENS, "stream_include_usage": True},
        )
        chunks = [event.model_dump() for event in events]
        deltas = [c["choices"][0] for c in chunks if c["choices"]]
        text = "".join(d["delta"]["content"] for d in deltas)
        finishes = [d.get("finish_reason") for d in deltas if d.get("finish_reason")]
        assert {c["object"] for c in chunks} == {"transcription.chunk"}
        return text, finishes, chunks[-1]["usage"]

    theirs, ours = _both(servers, call)
    assert ours == theirs
    assert theirs[1] == ["length", "length"]  # one finish per clip


@pytest.mark.parametrize("response_format", ["srt", "vtt"])
def test_formats_vllm_refuses(servers, response_format):
    for client in servers:
        with pytest.raises(openai.BadRequestError, match="only support response_format"):
            client.audio.transcriptions.create(
                model="tiny", file=SHORT, response_format=response_format, language="en"
            )


def test_bad_audio_is_a_400_and_the_gateway_keeps_serving(servers):
    for client in servers:
        with pytest.raises(openai.BadRequestError, match="Invalid or corrupted audio data"):
            client.audio.transcriptions.create(
                model="tiny", file=("x.wav", b"RIFF not really audio" * 50), language="en"
            )
    reply = servers.gateway.audio.transcriptions.create(
        model="tiny", file=SHORT, language="en", extra_body=MAX_TOKENS
    )
    assert reply.text


def test_a_transcription_model_serves_no_chat(servers):
    """vLLM mounts no chat or completions route for a transcription-only model: a 404 on
    both."""
    for client in servers:
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model="tiny", prompt="hi", max_tokens=2)
