"""Our streaming gRPC client (gateway.transport) against grpc.aio, on the same worker.

    python -m benchmarks.grpc_stream_bench [--streams 3000] [--concurrency 32] [--rounds 3]

Starts `benchmarks.mock_worker` (16 tokens per Generate: 17 messages per streamed call) and,
in this process, calls Generate as the gateway does: a closed loop of `--concurrency` callers,
each message parsed into a GenerateResponse. Two requests: the text prompt (56 token ids) and
an image prompt with a 640x480 image's uint8 patches inline (254 KB, as the gateway sends it),
which exercises the send path and flow control. The clients alternate within each round; the
table shows, per client, the median over rounds of process CPU time per call (all threads: the
gRPC C core's own threads count) and of calls per second.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import uvloop

from benchmarks.gateway_bench import free_port, worker_ready
from engine_server.tiny_models import ensure_model
from gateway.transport import StreamChannel
from gateway.workers.worker import GENERATE_PATH
from protos import vllm_engine_pb2 as pb
from protos import vllm_engine_pb2_grpc as pb_grpc

Call = Callable[[], Awaitable[int]]


def requests() -> dict[str, pb.GenerateRequest]:
    text = pb.GenerateRequest(
        request_id="bench", tokenized=pb.TokenizedInput(input_ids=list(range(56))), stream=True
    )
    image = pb.GenerateRequest()
    image.CopyFrom(text)
    item = image.mm_inputs.pixel_values
    item.inline = bytes(range(256)) * (216 * 1176 // 256)  # ~254 KB of uint8 patches
    item.shape.extend([len(item.inline)])
    item.dtype = "uint8"
    return {"text": text, "image (254 KB)": image}


def grpcio_call(stub: pb_grpc.VllmEngineStub, request: pb.GenerateRequest) -> Call:
    async def call() -> int:
        return len([r async for r in stub.Generate(request)])

    return call


def ours_call(channel: StreamChannel, request: pb.GenerateRequest) -> Call:
    payload = request.SerializeToString()

    async def call() -> int:
        messages = channel.stream(GENERATE_PATH, payload)
        return len([pb.GenerateResponse.FromString(m) async for m in messages])

    return call


async def closed_loop(call: Call, streams: int, concurrency: int) -> tuple[float, float]:
    """(CPU ms per call, calls per second) for `streams` calls, `concurrency` at a time."""
    await asyncio.gather(*(call() for _ in range(concurrency)))  # warm connections
    todo = iter(range(streams))

    async def caller() -> None:
        for _ in todo:
            assert await call() == 17

    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return cpu / streams * 1e3, streams / wall


async def measure(address: str, args: argparse.Namespace) -> dict[tuple[str, str], list]:
    results: dict[tuple[str, str], list] = {}
    channel = grpc.aio.insecure_channel(address, options=[("grpc.max_send_message_length", -1)])
    ours = StreamChannel(address)
    stub = pb_grpc.VllmEngineStub(channel)
    for round_index in range(args.rounds):
        for kind, request in requests().items():
            clients = [("grpc.aio", grpcio_call(stub, request)), ("ours", ours_call(ours, request))]
            for name, call in clients[:: 1 if round_index % 2 == 0 else -1]:
                result = await closed_loop(call, args.streams, args.concurrency)
                results.setdefault((kind, name), []).append(result)
                print(
                    f"  round {round_index + 1} {kind:15s} {name:8s} "
                    f"{result[0]:.3f} ms CPU/call {result[1]:7.0f} calls/s",
                    flush=True,
                )
    await channel.close()
    await ours.close()
    return results


def report(results: dict[tuple[str, str], list]) -> None:
    print(
        "\n| request | client | CPU ms per call (median) | calls/s (median) | CPU grpc.aio / ours |"
    )
    print("|---|---|---|---|---|")
    for kind in dict.fromkeys(k for k, _ in results):
        base = statistics.median(r[0] for r in results[(kind, "grpc.aio")])
        for name in ("grpc.aio", "ours"):
            cpu = statistics.median(r[0] for r in results[(kind, name)])
            rate = statistics.median(r[1] for r in results[(kind, name)])
            print(f"| {kind} | {name} | {cpu:.3f} | {rate:.0f} | {base / cpu:.2f}x |")


def _ready(address: str) -> bool:
    try:
        return worker_ready(address)
    except grpc.RpcError:
        return False


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.grpc_stream_bench", description=__doc__)
    p.add_argument("--streams", type=int, default=3000, help="calls per measurement")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    port = free_port()
    model = ensure_model("vision")
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "benchmarks.mock_worker",
            "--model",
            str(model),
            "--port",
            str(port),
        ],
        cwd=Path(__file__).resolve().parents[1],
    )
    try:
        deadline = time.monotonic() + 60
        while not _ready(f"127.0.0.1:{port}"):
            if time.monotonic() > deadline or worker.poll() is not None:
                raise SystemExit("mock worker did not start")
            time.sleep(0.2)
        report(uvloop.run(measure(f"127.0.0.1:{port}", args)))
    finally:
        worker.terminate()
        worker.wait(10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
