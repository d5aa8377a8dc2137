"""A bounded, loopback load generator for chat completions (HTTP) or Generate (gRPC).

    python -m benchmarks.load_gen --target http://127.0.0.1:8000 --model NAME \
        --kind text|image [--stream] --concurrency 32 (--requests N | --duration S)
    python -m benchmarks.load_gen --target grpc://127.0.0.1:50051 --grpc-request FILE ...

`--concurrency` clients each keep one connection and send their next request as soon as the
previous answer is complete (closed loop), until `--requests` have been sent or `--duration`
seconds have passed. It prints one JSON object: requests/s, latency p50/p99/mean, time to
first token for streams (the first SSE event carrying text; the first chunk over gRPC),
errors, and its own CPU seconds over the measured window, so a reader can tell whether the
load generator itself was the bottleneck.

The HTTP client is a minimal HTTP/1.1 keep-alive client over asyncio streams (on uvloop when
installed), about ten times cheaper per request than httpx: it parses the status line, the
headers and a Content-Length or chunked body, and nothing else. `--kind` picks the bodies
(`benchmarks.workloads`): one fixed text or image chat, or every request different (varied
text chat, a distinct image each, 3-turn chats resending two images).

With `--wait-for-go` it warms up, prints `warm`, and starts measuring when a line arrives on
stdin, so a parent process can read other processes' CPU counters around the measured window.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import resource
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from benchmarks.workloads import FIXED_KINDS, KINDS, body_maker

WARMUP_REQUESTS = 8
CHAT_PATH = "/v1/chat/completions"
CONTENT_EVENT = re.compile(rb'"content":\s*"[^"]')


# ---- request bodies ----


def chat_body(kind: str, model: str, stream: bool, max_tokens: int) -> dict:
    """The first request of `kind` (see benchmarks.workloads)."""
    return body_maker(kind, model, stream, max_tokens, clients=1)(0, 0)


# ---- results ----


@dataclass
class Sample:
    latency: float
    ttft: float | None


@dataclass
class LoadResult:
    target: str
    kind: str
    stream: bool
    concurrency: int
    requests: int = 0
    errors: int = 0
    wall_s: float = 0.0
    rps: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    mean_ms: float = 0.0
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    client_cpu_s: float = 0.0
    first_error: str = ""


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of unsorted values (0 when empty)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(fraction * len(ordered) + 0.5) - 1))
    return ordered[rank]


def summarize(result: LoadResult, samples: list[Sample], wall: float, cpu: float) -> LoadResult:
    latencies = [s.latency * 1000 for s in samples]
    ttfts = [s.ttft * 1000 for s in samples if s.ttft is not None]
    result.requests = len(samples)
    result.wall_s = round(wall, 3)
    result.rps = round(len(samples) / wall, 1) if wall > 0 else 0.0
    result.p50_ms = round(percentile(latencies, 0.50), 2)
    result.p99_ms = round(percentile(latencies, 0.99), 2)
    result.mean_ms = round(sum(latencies) / len(latencies), 2) if latencies else 0.0
    if ttfts:
        result.ttft_p50_ms = round(percentile(ttfts, 0.50), 2)
        result.ttft_p99_ms = round(percentile(ttfts, 0.99), 2)
    result.client_cpu_s = round(cpu, 3)
    return result


def process_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# ---- HTTP/1.1 client ----


class HttpError(Exception):
    pass


@dataclass
class HttpConnection:
    host: str
    port: int
    reader: asyncio.StreamReader | None = None
    writer: asyncio.StreamWriter | None = None

    async def ensure_open(self) -> None:
        if self.writer is None or self.writer.is_closing():
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def encode_post(host: str, path: str, body: bytes) -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Accept: */*\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def parse_head(head: bytes) -> tuple[int, dict[bytes, bytes]]:
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip().lower()
    return status, headers


async def read_chunked(reader: asyncio.StreamReader, on_data) -> bytes:
    """Read a chunked body, calling on_data(chunk) per chunk; returns the last chunk."""
    last = b""
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers
                pass
            return last
        data = (await reader.readexactly(size + 2))[:-2]
        on_data(data)
        last = data


async def http_request(conn: HttpConnection, payload: bytes, stream: bool) -> Sample:
    await conn.ensure_open()
    start = time.perf_counter()
    first: list[float] = []

    def on_data(data: bytes) -> None:
        if not first and CONTENT_EVENT.search(data):
            first.append(time.perf_counter() - start)

    conn.writer.write(payload)
    status, headers = parse_head(await conn.reader.readuntil(b"\r\n\r\n"))
    if headers.get(b"transfer-encoding") == b"chunked":
        tail = await read_chunked(conn.reader, on_data if stream else _ignore)
    else:
        tail = await conn.reader.readexactly(int(headers.get(b"content-length", b"0")))
    elapsed = time.perf_counter() - start
    if headers.get(b"connection") == b"close":
        await conn.close()
    check_http_answer(status, tail, stream)
    return Sample(elapsed, first[0] if first else None)


def _ignore(data: bytes) -> None:
    return None


def check_http_answer(status: int, tail: bytes, stream: bool) -> None:
    if status != 200:
        raise HttpError(f"HTTP {status}: {tail[:300]!r}")
    if stream and b"[DONE]" not in tail:
        raise HttpError(f"stream ended without [DONE]: {tail[-300:]!r}")
    if not stream and b'"finish_reason"' not in tail:
        raise HttpError(f"no finish_reason in the answer: {tail[:300]!r}")


# ---- gRPC client ----


def load_generate_request(path: Path, stream: bool):
    from protos import vllm_engine_pb2 as pb

    request = pb.GenerateRequest.FromString(path.read_bytes())
    request.stream = stream
    return request


async def grpc_request(stub, request, index: int) -> Sample:
    request.request_id = f"direct-{index}"
    start = time.perf_counter()
    return await generate_sample(stub.Generate(request), start)


async def generate_sample(responses, start: float) -> Sample:
    ttft = None
    done = False
    async for response in responses:
        if ttft is None and response.HasField("chunk"):
            ttft = time.perf_counter() - start
        done = done or response.HasField("complete")
    if not done:
        raise HttpError("Generate ended without a Complete")
    return Sample(time.perf_counter() - start, ttft)


# ---- the closed loop ----


@dataclass
class Plan:
    requests: int
    duration: float
    concurrency: int
    issued: int = 0
    deadline: float = field(default=float("inf"))

    def take(self) -> int | None:
        if self.issued >= self.requests or time.perf_counter() >= self.deadline:
            return None
        self.issued += 1
        return self.issued - 1


async def client_loop(
    send, client: int, plan: Plan, samples: list[Sample], errors: list[str]
) -> None:
    while (index := plan.take()) is not None:
        try:
            samples.append(await send(index, client))
        except Exception as error:  # noqa: BLE001 - every failure is counted, the first kept
            errors.append(f"{type(error).__name__}: {error}")


async def run_closed_loop(send, plan: Plan) -> tuple[list[Sample], list[str], float, float]:
    samples: list[Sample] = []
    errors: list[str] = []
    cpu0, start = process_cpu_seconds(), time.perf_counter()
    plan.deadline = start + plan.duration
    clients = [client_loop(send, c, plan, samples, errors) for c in range(plan.concurrency)]
    await asyncio.gather(*clients)
    wall = time.perf_counter() - start
    return samples, errors, wall, process_cpu_seconds() - cpu0


async def warm_up(send, concurrency: int) -> None:
    """Open every connection and run a few requests first (not measured)."""
    await run_closed_loop(send, Plan(max(WARMUP_REQUESTS, concurrency), float("inf"), concurrency))


def http_sender(args: argparse.Namespace):
    """Client c's n-th request (warm-up included) is body (c, n): a workload that changes per
    request never repeats one, and a conversation's turns go in order on one connection."""
    url = urlsplit(args.target)
    make = body_maker(args.kind, args.model, args.stream, args.max_tokens, args.concurrency)
    fixed = encode_post(url.netloc, CHAT_PATH, json.dumps(make(0, 0)).encode())
    sent = [0] * args.concurrency
    pool = [HttpConnection(url.hostname, url.port) for _ in range(args.concurrency)]

    def payload(client: int) -> bytes:
        if args.kind in FIXED_KINDS:
            return fixed
        sent[client] += 1
        return encode_post(url.netloc, CHAT_PATH, _dumps(make(client, sent[client] - 1)))

    async def send(index: int, client: int) -> Sample:
        conn = pool[client]
        try:
            return await http_request(conn, payload(client), args.stream)
        except BaseException:
            await conn.close()
            raise

    async def close() -> None:
        for conn in pool:
            await conn.close()

    return send, close


def _dumps(body: dict) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def grpc_sender(args: argparse.Namespace):
    import grpc

    from protos import vllm_engine_pb2_grpc as pb_grpc

    channel = grpc.aio.insecure_channel(
        args.target.removeprefix("grpc://"),
        options=[("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)],
    )
    stub = pb_grpc.VllmEngineStub(channel)
    template = load_generate_request(args.grpc_request, args.stream)

    async def send(index: int, client: int) -> Sample:
        request = type(template)()
        request.CopyFrom(template)
        return await grpc_request(stub, request, index)

    return send, channel.close


def stream_sender(args: argparse.Namespace):
    """Generate through the gateway's own HTTP/2 client, the request serialized once: the
    cheapest way to call the worker, so the direct baseline is the worker's own time (grpcio's
    Python client spends 6.6 ms of CPU sending a 1.8 MB image request)."""
    from gateway.transport import StreamChannel
    from gateway.workers.worker import GENERATE_PATH
    from protos import vllm_engine_pb2 as pb

    template = load_generate_request(args.grpc_request, args.stream)
    template.ClearField("request_id")
    rest = template.SerializeToString()
    channel = StreamChannel(args.target.removeprefix("grpc://"))

    async def responses(pieces: list[bytes]):
        async for message in channel.stream(GENERATE_PATH, pieces):
            yield pb.GenerateResponse.FromString(message)

    async def send(index: int, client: int) -> Sample:
        start = time.perf_counter()
        head = pb.GenerateRequest(request_id=f"direct-{index}").SerializeToString()
        return await generate_sample(responses([head, rest]), start)

    return send, channel.close


async def wait_for_go() -> None:
    print("warm", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)


async def run(args: argparse.Namespace) -> LoadResult:
    is_grpc = args.target.startswith("grpc://")
    if is_grpc:
        send, close = grpc_sender(args) if args.grpc_client == "grpcio" else stream_sender(args)
    else:
        send, close = http_sender(args)
    result = LoadResult(args.target, args.kind, args.stream, args.concurrency)
    try:
        await warm_up(send, args.concurrency)
        if args.wait_for_go:
            await wait_for_go()
        plan = Plan(args.requests, args.duration, args.concurrency)
        samples, errors, wall, cpu = await run_closed_loop(send, plan)
    finally:
        await close()
    result.errors = len(errors)
    result.first_error = errors[0][:500] if errors else ""
    return summarize(result, samples, wall, cpu)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.load_gen", description=__doc__)
    p.add_argument("--target", required=True, help="http://HOST:PORT or grpc://HOST:PORT")
    p.add_argument("--model", default="", help="the model name for HTTP bodies")
    p.add_argument("--kind", choices=KINDS, default="text")
    p.add_argument("--stream", action="store_true")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--requests", type=int, default=10**9, help="stop after this many")
    p.add_argument("--duration", type=float, default=float("inf"), help="or after this long")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--grpc-request", type=Path, help="a serialized GenerateRequest (gRPC)")
    p.add_argument(
        "--grpc-client",
        choices=("mmgate", "grpcio"),
        default="mmgate",
        help="gRPC targets: the gateway's HTTP/2 client (default) or grpcio's",
    )
    p.add_argument("--wait-for-go", action="store_true", help="measure after a line on stdin")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.requests >= 10**9 and args.duration == float("inf"):
        args.requests = 1000
    if args.target.startswith("grpc://") and args.grpc_request is None:
        raise SystemExit("--grpc-request is required for a grpc:// target")
    if not args.target.startswith("grpc://") or args.grpc_client == "mmgate":
        _use_uvloop()
    result = asyncio.run(run(args))
    print(json.dumps(asdict(result)), flush=True)
    return 0


def _use_uvloop() -> None:
    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


if __name__ == "__main__":
    raise SystemExit(main())
