"""Real engines for tests: our worker as a subprocess (`mmgate engine`) and vLLM's AsyncLLM
in-process as the reference, both on the same tiny local model with the same settings."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import grpc

from protos import vllm_engine_pb2 as pb
from protos import vllm_engine_pb2_grpc as pb_grpc
from tests.support import ROOT, refuse_in_fast_tests

# One process per engine, no compilation, small KV cache: ~10 s to ready on a CPU.
ENGINE_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_LOGGING_LEVEL": "WARNING",
    "TOKENIZERS_PARALLELISM": "false",
}
MAX_MODEL_LEN = 1024
ENGINE_KWARGS: dict[str, Any] = {
    "max_model_len": MAX_MODEL_LEN,
    "enforce_eager": True,
    "distributed_executor_backend": "uni",
    "seed": 0,
    "dtype": "float32",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engine_cli_args(kwargs: dict[str, Any]) -> list[str]:
    args = []
    for key, value in kwargs.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value is False:
            args.append("--no-" + key.replace("_", "-"))
        elif isinstance(value, dict):
            args += [flag, json.dumps(value)]
        else:
            args += [flag, str(value)]
    return args


# vLLM's server keeps responses only with this set (otherwise `store` is silently false).
RESPONSES_STORE_ENV = {"VLLM_ENABLE_RESPONSES_API_STORE": "1"}


class WorkerProcess:
    """`mmgate engine` in a subprocess; ready once HealthCheck answers healthy."""

    def __init__(
        self,
        model: Path,
        log_path: Path,
        host: str = "127.0.0.1",
        port: int | None = None,
        env: dict[str, str] | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        **extra: Any,
    ) -> None:
        """`env`: over ENGINE_ENV (e.g. vLLM's multiprocessing back on); `credentials`: how
        this client reaches a worker serving TLS (its --tls-* flags in `extra`); `extra`:
        engine arguments."""
        self._credentials = credentials
        refuse_in_fast_tests(f"{type(self).__name__} on {model}")
        self._env = {**os.environ, **ENGINE_ENV, **(env or {})}
        self.host, self.port = host, port or free_port()
        self._chosen_port = port is None
        self.address = f"{host}:{self.port}"
        self.log_path = log_path
        self._args = engine_cli_args({"model": str(model), **ENGINE_KWARGS, **extra})
        self._start()

    def _start(self) -> None:
        self._log = open(self.log_path, "w")  # noqa: SIM115 - lives as long as the process
        # Its own process group: kill() takes vLLM's EngineCore child down with it.
        self.proc = subprocess.Popen(
            self.command(self._args),
            cwd=ROOT,
            env=self._env,
            stdout=self._log,
            stderr=self._log,
            start_new_session=True,
        )

    def _restart_on_a_taken_port(self) -> bool:
        """A port from free_port() can be taken before the process binds it (another engine's
        internal sockets pick ephemeral ports too): start again on a fresh one."""
        taken = any(s in self.log_tail() for s in ("Failed to bind", "Address already in use"))
        if not (self._chosen_port and taken):
            return False
        self._log.close()
        if hasattr(self, "_channel"):  # it points at the old port
            self._channel.close()
            del self._channel
        self.port = free_port()
        self.address = f"{self.host}:{self.port}"
        self._start()
        return True

    def command(self, args: list[str]) -> list[str]:
        bind = ["--host", self.host, "--port", str(self.port)]
        return [sys.executable, "-m", "gateway.cli", "engine", *bind, *args]

    def is_ready(self) -> bool:
        return self.stub().HealthCheck(pb.HealthCheckRequest(), timeout=2).healthy

    def wait_ready(self, timeout: float = 300.0) -> WorkerProcess:
        deadline = time.monotonic() + timeout
        restarts = 2
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if restarts and self._restart_on_a_taken_port():
                    restarts -= 1
                    continue
                raise RuntimeError(f"worker exited {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if self.is_ready():
                    return self
            except grpc.RpcError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"worker not ready in {timeout}s:\n{self.log_tail()}")

    def stub(self) -> pb_grpc.VllmEngineStub:
        if not hasattr(self, "_channel"):
            if self._credentials is None:
                self._channel = grpc.insecure_channel(self.address)
            else:
                self._channel = grpc.secure_channel(self.address, self._credentials)
        return pb_grpc.VllmEngineStub(self._channel)

    def log_tail(self, lines: int = 60) -> str:
        self._log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def freeze(self) -> None:
        """Stop the worker and its engine where they are (SIGSTOP to the whole group)."""
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        """Let a frozen worker go on (SIGCONT to the whole group)."""
        os.killpg(self.proc.pid, signal.SIGCONT)

    def kill(self) -> None:
        """Sudden death of the worker and its engine (SIGKILL to the whole group)."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()
        return self.proc.returncode


def serve_worker(
    model: Path, tmp_path_factory: Any, name: str, **extra: Any
) -> Iterator[WorkerProcess]:
    """A ready `mmgate engine` for a fixture to yield from; stopped when the fixture ends."""
    worker = WorkerProcess(model, tmp_path_factory.mktemp("logs") / f"{name}.log", **extra)
    try:
        yield worker.wait_ready()
    finally:
        worker.stop()


class UpstreamServicerProcess(WorkerProcess):
    """SMG's own servicer (PyPI smg-grpc-servicer, what `vllm serve --grpc` runs) over vLLM,
    started by vLLM's gRPC launcher with its defaults. Ready once the standard health service
    says SERVING: its VllmEngine HealthCheck answers healthy while its start-up warm-up still
    runs requests through the engine."""

    def command(self, args: list[str]) -> list[str]:
        bind = ["--host", "127.0.0.1", "--port", str(self.port)]
        return [sys.executable, "-m", "vllm.entrypoints.launchers.grpc_server", *bind, *args]

    def is_ready(self) -> bool:
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        self.stub()  # opens the channel
        check = health_pb2.HealthCheckRequest(service="vllm.grpc.engine.VllmEngine")
        reply = health_pb2_grpc.HealthStub(self._channel).Check(check, timeout=2)
        return reply.status == health_pb2.HealthCheckResponse.SERVING


class VllmServerProcess(WorkerProcess):
    """vLLM's own OpenAI server (`vllm serve`) on the same model and engine settings: the
    reference a request through mmgate must equal (its HF processor runs in process)."""

    def command(self, args: list[str]) -> list[str]:
        bind = ["--host", self.host, "--port", str(self.port)]
        module = "vllm.entrypoints.openai.api_server"
        return [sys.executable, "-m", module, *bind, "--served-model-name", "tiny", *args]

    @property
    def base_url(self) -> str:
        return f"http://{self.address}"

    def is_ready(self) -> bool:
        import httpx

        try:
            return httpx.get(f"{self.base_url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def client(self):
        from openai import OpenAI

        return OpenAI(base_url=f"{self.base_url}/v1", api_key="x", max_retries=0, timeout=120)


class ReferenceEngine:
    """vLLM's AsyncLLM called directly, on a private event loop in a background thread."""

    def __init__(self, model: Path, **extra: Any) -> None:
        refuse_in_fast_tests(f"vLLM's AsyncLLM on {model}")
        for key, value in ENGINE_ENV.items():
            os.environ.setdefault(key, value)
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        args = AsyncEngineArgs(model=str(model), **{**ENGINE_KWARGS, **extra})

        async def build() -> Any:
            return AsyncLLM.from_engine_args(args)

        self.llm = self.run(build())

    def run(self, coro: Coroutine) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=300)

    def generate(self, prompt: Any, params: Any, request_id: str) -> Any:
        async def final() -> Any:
            last = None
            async for output in self.llm.generate(prompt, params, request_id):
                last = output
            return last

        return self.run(final())

    def embed(self, token_ids: list[int], request_id: str) -> list[float]:
        from vllm import PoolingParams
        from vllm.inputs.engine import tokens_input

        async def final() -> Any:
            last = None
            async for output in self.llm.encode(
                tokens_input(token_ids), PoolingParams(task="embed"), request_id
            ):
                last = output
            return last

        return self.run(final()).outputs.data.flatten().tolist()

    def close(self) -> None:
        self.llm.shutdown()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)


def generate(stub: pb_grpc.VllmEngineStub, request: pb.GenerateRequest) -> list:
    return list(stub.Generate(request, timeout=120))


def python() -> str:
    return sys.executable


def direct_chat(
    stub: pb_grpc.VllmEngineStub, model_dir: Path | str, messages: list[dict], max_tokens: int
) -> tuple[list[int], list[int], str]:
    """What a worker generates, greedily, for the chat-templated `messages`, asked directly
    over gRPC (no gateway): the prompt ids, the output ids and their text."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    req = pb.GenerateRequest(
        request_id="direct",
        tokenized=pb.TokenizedInput(input_ids=ids),
        sampling_params=pb.SamplingParams(temperature=0.0, max_tokens=max_tokens),
    )
    (done,) = [r.complete for r in stub.Generate(req)]
    return ids, list(done.output_ids), tokenizer.decode(done.output_ids, skip_special_tokens=True)
