"""Audio the gateway preprocesses goes only to workers that take it.

mmgate's engine advertises `audio_mm_inputs` (GetServerInfo trailing metadata); SMG's upstream
servicer advertises nothing and cannot take audio mm_inputs (it answers 400 "Unsupported proto
tensor dtype: 'int32'"). So with Qwen2-Audio's processor in the gateway, on
`--mm-processing auto`: a pool with such a worker preprocesses the clips and picks (and
reroutes) among those workers only; a pool without one refers the clips to a worker
(media_refs); on `--mm-processing gateway` a pool without one is a 400. Requests without audio
still go to every worker.
"""

from __future__ import annotations

import asyncio
import base64
import io
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from engine_server import model_info
from gateway.api.chat import ChatService
from gateway.api.protocol import ChatCompletionRequest
from gateway.errors import GatewayError
from gateway.observability.metrics import GatewayMetrics
from gateway.render.model_files import ModelFiles
from gateway.render.prompt import PromptBuilder
from gateway.render.renderer import ChatRenderer
from gateway.stream.logprobs import TokenTexts
from gateway.workers.pool import NO_AUDIO_INPUTS_WORKER, WorkerPool
from gateway.workers.worker import WorkerFacts
from multimodal.media import MediaPolicy
from multimodal.pipeline import PixelEncoding
from multimodal.registry import processors_for
from protos import extensions
from tests.support.audio_refs import require

MEDIA_REFS = frozenset({"data", "http", "https"})


def facts(audio: bool) -> WorkerFacts:
    """A worker that preprocesses media itself (media_refs), and takes preprocessed audio
    (mmgate's engine) or not (SMG's servicer)."""
    return WorkerFacts(
        model_path="m",
        served_model_name="m",
        max_context_length=4096,
        vocab_size=100_000,
        eos_token_ids=[1],
        supports_vision=True,
        is_generation=True,
        pixels=PixelEncoding.for_engine(False, "float32"),
        media_ref_schemes=MEDIA_REFS,
        extensions=frozenset({extensions.TAKES_AUDIO_MM_INPUTS} if audio else ()),
    )


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    from tests.support.qwen2_audio_models import build_model

    return build_model(tmp_path_factory.mktemp("qwen2-audio") / "model")


def service(model: Path, pool: WorkerPool, mm_processing: str = "auto") -> ChatService:
    files = ModelFiles.load(model)
    processors = processors_for(files)
    assert "audio" in processors.by_modality  # the gateway can preprocess these clips
    renderer = ChatRenderer(files, processors.placeholders)
    prompts = PromptBuilder(renderer, processors, MediaPolicy(), mm_processing=mm_processing)
    metrics = GatewayMetrics()
    return ChatService("m", files, prompts, pool, metrics, TokenTexts(files.tokenizer))


def pool_of(*audio: bool) -> WorkerPool:
    pool = WorkerPool([f"grpc://127.0.0.1:{1 + i}" for i in range(len(audio))])
    for worker, takes in zip(pool.workers.values(), audio):
        worker.facts = facts(takes)
        worker.health.force(True)
    return pool


def wav() -> str:
    soundfile = require("soundfile")
    t = np.arange(16000) / 16000
    out = io.BytesIO()
    soundfile.write(out, 0.3 * np.sin(2 * np.pi * 440 * t), 16000, format="WAV")
    return base64.b64encode(out.getvalue()).decode()


def request(audio: bool) -> ChatCompletionRequest:
    content: list[dict] = [{"type": "text", "text": "What is it?"}]
    if audio:
        content.insert(0, {"type": "input_audio", "input_audio": {"data": wav(), "format": "wav"}})
    return ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": content}], max_tokens=4
    )


def start(model: Path, audio_workers: tuple[bool, ...], audio: bool = True, **kw):
    """The workers `start` picks over a few requests, and whether each went as mm_inputs."""

    async def run():
        pool = pool_of(*audio_workers)
        try:
            chat = service(model, pool, **kw)
            picked, preprocessed = [], []
            for _ in range(4):
                run = await chat.start(request(audio))
                urls = list(pool.workers)
                picked.append(urls.index(run.worker.url))
                preprocessed.append(run.generation.generate.HasField("media_refs") is False)
            reroute = run.generation.call.reroute
            return set(picked), set(preprocessed), reroute([run.worker])
        finally:
            await pool.close()

    return asyncio.run(run())


def test_auto_in_a_mixed_pool_preprocesses_for_the_workers_that_take_audio(model):
    picked, preprocessed, rerouted = start(model, (False, True))
    assert picked == {1} and preprocessed == {True}
    assert rerouted is None  # not to SMG's servicer, which would refuse the tensors


def test_auto_refers_the_clips_when_no_worker_takes_preprocessed_audio(model):
    picked, preprocessed, rerouted = start(model, (False, False))
    assert picked == {0, 1} and preprocessed == {False}
    assert rerouted is not None  # any worker that takes media_refs


def test_auto_with_only_our_workers_preprocesses(model):
    picked, preprocessed, _ = start(model, (True, True))
    assert picked == {0, 1} and preprocessed == {True}


def test_text_still_goes_to_every_worker(model):
    picked, _, rerouted = start(model, (False, True), audio=False)
    assert picked == {0, 1} and rerouted is not None


def test_gateway_mode_without_a_worker_taking_audio_is_a_400(model):
    with pytest.raises(GatewayError) as refused:
        start(model, (False,), mm_processing="gateway")
    assert refused.value.status == 400 and refused.value.message == NO_AUDIO_INPUTS_WORKER


def test_worker_mode_refers_even_to_workers_that_take_audio(model):
    picked, preprocessed, _ = start(model, (True, False), mm_processing="worker")
    assert picked == {0, 1} and preprocessed == {False}


def test_our_engine_always_advertises_it():
    for reasoning in (None, SimpleNamespace(enabled=True)):
        names = model_info.capabilities(SimpleNamespace(reasoning_config=reasoning))
        assert extensions.TAKES_AUDIO_MM_INPUTS in names
    read = extensions.capabilities(extensions.capabilities_metadata(names))
    assert facts(False).takes_audio_mm_inputs is False
    assert WorkerFacts(**{**facts(False).__dict__, "extensions": read}).takes_audio_mm_inputs
