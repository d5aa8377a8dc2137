"""One engine pair on the tiny Qwen2-VL for every gateway module that checks images or video
against vLLM: vLLM's own OpenAI server (the reference: its HF processor in process, its
Responses store on, request-level processor kwargs trusted) and `mmgate engine --mm-processor
inprocess` (takes preprocessed tensors and `media_refs` both). Session scope: an engine start
costs ~40 s on two cores, and the image, video, worker-media and API modules need the same
pair. Each module starts its own gateways on it (a gateway starts in about a second).

And one plain `mmgate engine` on it (no worker-side processor) for the image and playground
modules."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.support.e2e_cases import MM_LIMITS, QWEN2VL_CONTEXT, QWEN2VL_ENGINE
from tests.support.engines import (
    RESPONSES_STORE_ENV,
    VllmServerProcess,
    WorkerProcess,
    serve_worker,
)


@dataclass(frozen=True)
class EnginePair:
    vllm: VllmServerProcess
    ours: WorkerProcess


@pytest.fixture(scope="session")
def qwen2vl_pair(vision_model, tmp_path_factory) -> Iterator[EnginePair]:
    logs = tmp_path_factory.mktemp("qwen2vl-pair")
    vllm = VllmServerProcess(
        vision_model,
        logs / "vllm.log",
        env=RESPONSES_STORE_ENV,
        trust_request_mm_kwargs=True,
        **QWEN2VL_ENGINE,
    )
    ours = WorkerProcess(
        vision_model, logs / "ours.log", mm_processor="inprocess", **QWEN2VL_ENGINE
    )
    try:
        vllm.wait_ready()
        ours.wait_ready()
        yield EnginePair(vllm, ours)
    finally:
        ours.stop()
        vllm.stop()


@pytest.fixture(scope="session")
def qwen2vl_worker(vision_model, tmp_path_factory) -> Iterator[WorkerProcess]:
    """`mmgate engine` on the tiny Qwen2-VL that takes preprocessed tensors only."""
    yield from serve_worker(
        vision_model,
        tmp_path_factory,
        "qwen2vl-worker",
        limit_mm_per_prompt=MM_LIMITS,
        max_model_len=QWEN2VL_CONTEXT,
    )
