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

from tests.support.engines import RESPONSES_STORE_ENV, VllmServerProcess, WorkerProcess
from tests.support.gateway_process import GatewayProcess
from tests.support.qwen3_tools_model import (
    ENGINE,
    GATEWAY_ARGS,
    PARSER_FLAGS,
    SERVER_FLAGS,
    build_model,
)


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
    vllm = VllmServerProcess(model, logs / "vllm.log", env=RESPONSES_STORE_ENV, **engine, **server)
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
def vision_stack(vision_model, qwen2vl_pair, tmp_path_factory) -> Iterator[ApiStack]:
    """The shared tiny Qwen2-VL pair (no parsers) with a gateway: images through both APIs."""
    log = tmp_path_factory.mktemp("api-vision-stack") / "gw.log"
    gateway = GatewayProcess(vision_model, [qwen2vl_pair.ours.address], log).wait_ready()
    try:
        yield ApiStack(
            vision_model, qwen2vl_pair.vllm.base_url, gateway.base_url, gateway, qwen2vl_pair.ours
        )
    finally:
        gateway.stop()
