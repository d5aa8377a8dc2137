"""One engine pair for every test of the Responses and Messages APIs: vLLM's own OpenAI
server (the reference, its Responses store on) and `mmgate serve` in front of our worker, on
the tiny random Qwen3 tool model with vLLM's qwen3 reasoning and hermes tool parsers, as
tests/e2e/gateway/test_tool_calls.py runs them. Session scope: the pair starts once for all
the API modules (an engine start costs ~40 s on two cores)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.engines import VllmServerProcess, WorkerProcess
from tests.support.gateway_process import GatewayProcess
from tests.support.qwen3_tools_model import (
    ENGINE,
    GATEWAY_ARGS,
    PARSER_FLAGS,
    SERVER_FLAGS,
    build_model,
)

# vLLM keeps responses only with this set (otherwise `store` is silently false).
VLLM_ENV = {"VLLM_ENABLE_RESPONSES_API_STORE": "1"}


@dataclass(frozen=True)
class ApiStack:
    model: Path
    vllm_url: str  # vLLM's own server, e.g. http://127.0.0.1:PORT
    mmgate_url: str  # mmgate serve in front of our worker
    gateway: GatewayProcess
    worker: WorkerProcess


def serve_pair(
    model: Path, logs: Path, engine: dict, server: dict, gateway_args: tuple[str, ...] = ()
) -> Iterator[ApiStack]:
    """vLLM's server (`engine` and `server` flags, its store on) and mmgate in front of our
    worker (`engine` flags), for a fixture to yield from."""
    vllm = VllmServerProcess(model, logs / "vllm.log", env=VLLM_ENV, **engine, **server)
    worker = WorkerProcess(model, logs / "ours.log", **engine)
    gateway = None
    try:
        vllm.wait_ready()
        worker.wait_ready()
        gateway = GatewayProcess(model, [worker.address], logs / "gw.log", *gateway_args)
        gateway.wait_ready()
        yield ApiStack(model, vllm.base_url, gateway.base_url, gateway, worker)
    finally:
        for process in (gateway, worker, vllm):
            if process is not None:
                process.stop()


@pytest.fixture(scope="session")
def api_stack(tmp_path_factory) -> Iterator[ApiStack]:
    model = build_model(tmp_path_factory.mktemp("qwen3-api-tools") / "model")
    logs = tmp_path_factory.mktemp("api-stack")
    engine = {**PARSER_FLAGS, **ENGINE}
    yield from serve_pair(model, logs, engine, SERVER_FLAGS, GATEWAY_ARGS)


@pytest.fixture(scope="session")
def vision_stack(vision_model, tmp_path_factory) -> Iterator[ApiStack]:
    """The same pair on the tiny Qwen2-VL model (no parsers): images through both APIs."""
    from tests.support.e2e_cases import MM_LIMITS

    logs = tmp_path_factory.mktemp("api-vision-stack")
    engine = {"limit_mm_per_prompt": MM_LIMITS, "max_model_len": 2048}
    yield from serve_pair(vision_model, logs, engine, {})
