"""A VllmEngine worker that misbehaves on purpose, for what a real worker cannot be made to
do on demand (end a stream without its Complete, die after a given number of tokens, take a
guaranteed long time per token).

It answers the metadata RPCs with the facts of a real model directory (so the gateway starts
normally) and streams `tokens` token ids then follows `ending`: "complete" (well-behaved),
"truncate" (the stream just ends), or "abort" (the call fails with UNAVAILABLE).
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import grpc

from engine_server.tokenizer_bundle import build_zip, chunks
from protos import vllm_engine_pb2 as pb
from protos import vllm_engine_pb2_grpc as pb_grpc


class FakeServicer(pb_grpc.VllmEngineServicer):
    def __init__(self, model: Path, tokens: list[int], ending: str, delay: float) -> None:
        self.model, self.tokens, self.ending, self.delay = model, tokens, ending, delay
        self.bundle = build_zip(model)
        self.generate_calls = 0
        self.requests: list[pb.GenerateRequest] = []  # every Generate it was sent
        self.kv_transfer_params_json: str | None = None  # what its "connector" returns

    async def GetModelInfo(self, request, context):  # noqa: N802
        return pb.GetModelInfoResponse(
            model_path=str(self.model),
            served_model_name=str(self.model),
            is_generation=True,
            max_context_length=1024,
            vocab_size=3007,
            eos_token_ids=[3002],
        )

    async def GetServerInfo(self, request, context):  # noqa: N802
        return pb.GetServerInfoResponse(server_type="fake")

    async def HealthCheck(self, request, context):  # noqa: N802
        return pb.HealthCheckResponse(healthy=True)

    async def GetTokenizer(self, request, context):  # noqa: N802
        for chunk in chunks(self.bundle):
            yield chunk

    async def Generate(self, request, context):  # noqa: N802
        self.generate_calls += 1
        self.requests.append(request)
        for token in self.tokens:  # as a real worker: deltas only when asked to stream
            if request.stream:
                yield pb.GenerateResponse(chunk=pb.GenerateStreamChunk(token_ids=[token]))
            await asyncio.sleep(self.delay)
        if self.ending == "abort":
            await context.abort(grpc.StatusCode.UNAVAILABLE, "worker is shutting down")
        if self.ending == "complete":
            # streamed: the Complete repeats the last delta; else it carries every token
            ids = self.tokens[-1:] if request.stream else self.tokens
            done = pb.GenerateComplete(
                output_ids=ids,
                finish_reason="length",
                kv_transfer_params_json=self.kv_transfer_params_json,
            )
            yield pb.GenerateResponse(complete=done)


class FakeWorker:
    """Runs a FakeServicer on its own event loop in a thread; `address` is host:port."""

    def __init__(
        self, model: Path, tokens: list[int], ending: str = "complete", delay: float = 0.01
    ) -> None:
        self.servicer = FakeServicer(model, tokens, ending, delay)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = grpc.aio.server()
        pb_grpc.add_VllmEngineServicer_to_server(self.servicer, self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._loop.run_until_complete(self._server.start())
        self._ready.set()
        self._loop.run_forever()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._server.stop(0), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
