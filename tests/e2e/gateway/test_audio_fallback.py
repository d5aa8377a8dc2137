"""Audio through the worker-side fallback (`media_refs`): `mmgate serve` fetches and checks each
clip and `mmgate engine --mm-processor inprocess` (or SMG's own servicer in that mode) runs
vLLM's own processor on it. On the tiny Qwen2-Audio, for `input_audio` and `audio_url` parts,
16 kHz mono and 44.1 kHz stereo, WAV/FLAC/MP3/Ogg, one and two clips per prompt, the answers
equal vLLM's own OpenAI server's: prompt token count, greedy text and each token's logprobs.
The gateway on auto has Qwen2-Audio's processor, so it preprocesses the same clips itself
(mm_inputs to the same worker) and must answer the same. SMG's servicer takes no audio
mm_inputs and does not advertise `audio_mm_inputs` as our worker does: an auto gateway in front
of it refers the clips to it (media_refs) and answers the same too. Bad audio answers a 400
naming the clip, and the gateway keeps serving."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import pytest

from tests.support import audio_e2e
from tests.support.audio_e2e import assert_same_answer, clip, input_audio
from tests.support.family_e2e import REFERENCE_NAME, media_ref_engines
from tests.support.gateway_process import GatewayProcess
from tests.support.http_files import serve_bytes
from tests.support.qwen2_audio_models import build_model

# vLLM profiles with `limit` clips of 30 s (750 tokens each): two need a context above 1500.
ENGINE = {"max_model_len": 2048, "limit_mm_per_prompt": {"audio": 2}}
MAX_SECONDS = 5  # the auto gateway's --max-audio-seconds


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def audio_url(url: str) -> dict:
    return {"type": "audio_url", "audio_url": {"url": url}}


MONO_16K = clip(1.0)
STEREO_44K = clip(1.5, 44100, 2, seed=1)
CASES: dict[str, list[dict]] = {
    "input-audio-16k": [input_audio(MONO_16K)],
    "audio-url-44k-stereo": [audio_url(f"data:audio/wav;base64,{b64(STEREO_44K)}")],
    "two-clips": [input_audio(MONO_16K), audio_url(f"data:audio/wav;base64,{b64(STEREO_44K)}")],
    # other containers, declared as wav: vLLM ignores the declared format
    "flac-mp3": [
        input_audio(clip(0.8, 22050, 1, "FLAC", seed=2)),
        input_audio(clip(0.6, 44100, 2, "MP3", seed=3), "mp3"),
    ],
    "ogg": [input_audio(clip(0.7, 48000, 1, "OGG", seed=4))],
}


def chat(base_url: str, model: str, parts: list[dict], **extra: Any) -> httpx.Response:
    """One user turn of `parts` and a question, as `audio_e2e.chat` sends it."""
    return audio_e2e.chat(base_url, model, _turn(parts), **extra)


def answer(base_url: str, model: str, parts: list[dict]) -> dict:
    return audio_e2e.answer(base_url, model, _turn(parts))


def _turn(parts: list[dict]) -> list[dict]:
    return [{"role": "user", "content": [*parts, {"type": "text", "text": "What?"}]}]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("qwen2-audio") / "model")


@pytest.fixture(scope="module")
def engines(model, tmp_path_factory):
    """vLLM's server, our worker and SMG's servicer, both taking media_refs, started at once."""
    with media_ref_engines(model, tmp_path_factory.mktemp("audio-engines"), **ENGINE) as started:
        yield started


@pytest.fixture(scope="module")
def gateways(model, engines, tmp_path_factory):
    """In front of our worker: one told to leave media to the worker (and to fetch from this
    host's test server), one on auto (which preprocesses Qwen2-Audio's clips itself) with a
    short length limit; in front of SMG's servicer: one told to leave media to the worker, and
    one on auto (which must notice that the servicer takes no preprocessed audio)."""
    logs = tmp_path_factory.mktemp("audio-gateways")
    ours, upstream = [engines["ours"].address], [engines["upstream"].address]
    private = ("--allow-private-media-networks", "127.0.0.0/8")
    limit = ("--max-audio-seconds", str(MAX_SECONDS))
    worker_mode = ("--mm-processing", "worker", *private)
    started = {
        "worker": GatewayProcess(model, ours, logs / "worker.log", *worker_mode),
        "auto": GatewayProcess(model, ours, logs / "auto.log", *limit),
        "upstream": GatewayProcess(model, upstream, logs / "upstream.log", *worker_mode),
        "upstream-auto": GatewayProcess(model, upstream, logs / "upstream-auto.log"),
    }
    try:
        yield {name: gateway.wait_ready() for name, gateway in started.items()}
    finally:
        for gateway in started.values():
            gateway.stop()


@pytest.fixture(scope="module")
def reference(engines) -> dict[str, dict]:
    """vLLM's own server's answer to each case."""
    base = engines["vllm"].base_url
    return {name: answer(base, REFERENCE_NAME, parts) for name, parts in CASES.items()}


def test_the_auto_gateway_preprocesses_the_model_s_audio_itself(model, gateways):
    from gateway.render.model_files import ModelFiles
    from multimodal.registry import processors_for

    assert "audio" in processors_for(ModelFiles.load(model)).by_modality
    assert "no audio processor here" not in gateways["auto"].log_path.read_text()


@pytest.mark.parametrize("case", list(CASES))
def test_our_gateway_and_worker_answer_as_vllm(gateways, reference, model, case):
    for mode in ("worker", "auto"):
        assert_same_answer(
            answer(gateways[mode].base_url, str(model), CASES[case]), reference[case]
        )


@pytest.mark.parametrize("mode", ["upstream", "upstream-auto"])
def test_our_gateway_drives_smg_s_servicer_in_worker_and_auto_mode(
    gateways, reference, model, mode
):
    """On auto too: SMG's servicer does not advertise that it takes preprocessed audio, so the
    gateway refers the clips to it, though it has Qwen2-Audio's processor."""
    for case in ("two-clips", "flac-mp3"):
        got = answer(gateways[mode].base_url, str(model), CASES[case])
        assert_same_answer(got, reference[case])


def test_an_http_clip_is_fetched_by_the_gateway_as_vllm_fetches_it(gateways, engines, model):
    raw = clip(1.2, 44100, 2, "FLAC", seed=5)
    with serve_bytes(raw, "audio/flac") as host:
        parts = [audio_url(f"{host}/a.flac")]
        want = answer(engines["vllm"].base_url, REFERENCE_NAME, parts)
        assert_same_answer(answer(gateways["worker"].base_url, str(model), parts), want)
        # the auto gateway was not told to trust this host's addresses
        refused = chat(gateways["auto"].base_url, str(model), parts)
    assert refused.status_code == 400
    assert "audio 0:" in refused.json()["error"]["message"]
    assert "loopback" in refused.json()["error"]["message"]


BAD = {
    "garbage": ([input_audio(b"not audio at all" * 10)], "audio 0: not a supported audio format"),
    "truncated-second": (
        [input_audio(MONO_16K), input_audio(clip(1.0, fmt="FLAC")[:200])],
        "audio 1: invalid or corrupted audio data",
    ),
    "too-long": ([input_audio(clip(MAX_SECONDS + 1.0))], "audio 0: the audio lasts 6.0 s, above"),
    "no-data": (
        [{"type": "input_audio", "input_audio": {"format": "wav"}}],
        "content[0].input_audio.data is required",
    ),
}


@pytest.mark.parametrize(("parts", "message"), list(BAD.values()), ids=list(BAD))
def test_bad_audio_is_a_400_naming_the_clip_and_the_gateway_keeps_serving(
    gateways, reference, model, parts, message
):
    refused = chat(gateways["auto"].base_url, str(model), parts)
    assert refused.status_code == 400, refused.text
    assert message in refused.json()["error"]["message"]
    good = answer(gateways["auto"].base_url, str(model), CASES["input-audio-16k"])
    assert_same_answer(good, reference["input-audio-16k"])


def test_more_clips_than_the_engine_takes_are_refused_as_vllm_refuses_them(gateways, model):
    reply = chat(gateways["worker"].base_url, str(model), [input_audio(MONO_16K)] * 3)
    assert reply.status_code == 400
    # counted by the gateway from the worker's advertised limit, before anything is fetched
    assert reply.json()["error"]["message"] == "At most 2 audio(s) may be provided in one prompt."
