"""Soak: a thousand streams held through the gateway, a third of their clients leaving mid-way.

    python -m benchmarks.soak [--streams 1000] [--rounds 3] [--json FILE]

Starts the mock worker (benchmarks/mock_worker.py: no model, 16 tokens per stream, 0.25 s
apart, so every stream is held for ~4 s) and `mmgate serve` in front of it, on loopback, on
the tiny text model. Each round opens `--streams` streaming chats at once; every third client
reads three chunks and then drops its connection (a reset, as a closed browser tab). Meanwhile
a probe sends a short non-streamed chat every 0.1 s and records its latency. After each round
it waits until the worker has no call open, then reads the gateway's RSS and open file
descriptors. Round 1 warms up (what Python's allocator keeps after the first thousand streams
is a high-water mark, not a leak); every later round is compared with it.

Checks, each printed with its figures (exit status 1 if one fails):
- every client that stayed got its whole stream ([DONE]); no other error;
- every engine request ended: the worker saw as many Generate calls begin as finish or be
  cancelled, the cancelled ones exactly the clients that left, none still open;
- the gateway's RSS and open fds after the last round are within 10% of after round 1;
- the probe's p99 latency over the loaded rounds is under `--probe-p99-bound` seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks.load_gen import encode_post, parse_head, percentile

TOKENS, INTERVAL = 16, 0.25  # per stream, from the mock worker
LEAVE_AFTER_CHUNKS = 3
PROBE_EVERY = 0.1
GROWTH_BOUND = 0.10  # RSS and fds after the last round vs after the warm-up
# The probe waits behind a thousand requests arriving within the same second on 2 cores.
PROBE_P99_BOUND = 2.0
HOST = "127.0.0.1"


@dataclass
class Round:
    streams: int
    completed: int = 0
    left: int = 0
    errors: list[str] = field(default_factory=list)
    probes: list[float] = field(default_factory=list)
    seconds: float = 0.0
    rss_mb: float = 0.0
    fds: int = 0
    worker: dict[str, int] = field(default_factory=dict)


def chat(model: str, stream: bool, max_tokens: int) -> bytes:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Tell me about the sea."}],
        "max_tokens": max_tokens,
        "stream": stream,
    }
    return encode_post(HOST, "/v1/chat/completions", json.dumps(body).encode())


async def one_stream(port: int, payload: bytes, leave: bool, result: Round) -> None:
    """A streaming client: reads to [DONE], or drops the connection after a few chunks."""
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        writer.write(payload)
        status, _ = parse_head(await reader.readuntil(b"\r\n\r\n"))
        if status != 200:
            result.errors.append(f"HTTP {status}")
            return
        chunks, tail = 0, b""
        while b"[DONE]" not in tail:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                break
            tail = (await reader.readexactly(size + 2))[:-2]
            chunks += 1
            if leave and chunks == LEAVE_AFTER_CHUNKS:
                writer.transport.abort()  # a reset, not a polite close
                result.left += 1
                return
        if b"[DONE]" in tail:
            result.completed += 1
        else:
            result.errors.append(f"stream ended without [DONE] after {chunks} chunks")
    except (OSError, asyncio.IncompleteReadError, ValueError) as error:
        result.errors.append(f"{type(error).__name__}: {error}")
    finally:
        writer.close()


async def probe(port: int, payload: bytes, result: Round, stop: asyncio.Event) -> None:
    """Short non-streamed chats, one every PROBE_EVERY s, on a fresh connection each."""
    while not stop.is_set():
        started = time.perf_counter()
        reader, writer = await asyncio.open_connection(HOST, port)
        writer.write(payload)
        status, headers = parse_head(await reader.readuntil(b"\r\n\r\n"))
        await reader.readexactly(int(headers.get(b"content-length", b"0")))
        writer.close()
        if status != 200:
            result.errors.append(f"probe HTTP {status}")
        result.probes.append(time.perf_counter() - started)
        await asyncio.sleep(PROBE_EVERY)


async def one_round(port: int, model: str, streams: int) -> Round:
    result = Round(streams)
    payload = chat(model, stream=True, max_tokens=TOKENS)
    stop = asyncio.Event()
    prober = asyncio.create_task(probe(port, chat(model, False, 4), result, stop))
    started = time.perf_counter()
    await asyncio.gather(*(one_stream(port, payload, i % 3 == 2, result) for i in range(streams)))
    result.seconds = time.perf_counter() - started
    stop.set()
    await prober
    return result


class Services:
    """The mock worker and the gateway, as subprocesses."""

    def __init__(self, model: Path, workdir: Path, streams: int) -> None:
        from tests.support.engines import free_port

        self.stats_file = workdir / "worker-stats.json"
        worker_port, self.port = free_port(), free_port()
        python = sys.executable
        self.worker = subprocess.Popen(
            [python, "-m", "benchmarks.mock_worker", "--model", str(model), "--port",
             str(worker_port), "--output-tokens", str(TOKENS), "--token-interval",
             str(INTERVAL), "--stats-file", str(self.stats_file)],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        self.gateway = subprocess.Popen(
            [python, "-m", "gateway.cli", "serve", "--model", str(model), "--port",
             str(self.port), "--worker", f"grpc://{HOST}:{worker_port}",
             "--max-in-flight", str(streams + 64)],
            stdout=subprocess.DEVNULL, stderr=open(workdir / "gateway.log", "w"),  # noqa: SIM115
        )  # fmt: skip
        self.model = str(model)

    def wait_ready(self, timeout: float = 60.0) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://{HOST}:{self.port}/ready", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError("the gateway did not become ready")

    def worker_stats(self) -> dict[str, int]:
        return json.loads(self.stats_file.read_text())

    async def settle(self, timeout: float = 30.0) -> dict[str, int]:
        """The worker's counts once no call is open (the gateway has ended every one)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            stats = self.worker_stats()
            if stats["active"] == 0:
                await asyncio.sleep(0.5)  # and let the gateway finish its own bookkeeping
                return self.worker_stats()
            await asyncio.sleep(0.1)
        return self.worker_stats()

    def gateway_usage(self) -> tuple[float, int]:
        import psutil

        process = psutil.Process(self.gateway.pid)
        return process.memory_info().rss / 2**20, process.num_fds()

    def stop(self) -> None:
        for process in (self.gateway, self.worker):
            process.terminate()
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()


def raise_fd_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(needed, soft)), hard))


async def soak(model: Path, streams: int, rounds: int, workdir: Path) -> list[Round]:
    raise_fd_limit(4 * streams + 256)  # ours and, inherited, the gateway's
    services = Services(model, workdir, streams)
    try:
        services.wait_ready()
        results = []
        for number in range(1, rounds + 1):
            result = await one_round(services.port, services.model, streams)
            result.worker = await services.settle()
            result.rss_mb, result.fds = services.gateway_usage()
            results.append(result)
            print(f"round {number}: {summary(result)}", file=sys.stderr, flush=True)
        return results
    finally:
        services.stop()


def summary(r: Round) -> str:
    return (
        f"{r.streams} streams in {r.seconds:.1f} s: {r.completed} whole, {r.left} left, "
        f"{len(r.errors)} errors; probe p99 {percentile(r.probes, 0.99) * 1000:.0f} ms; "
        f"worker {r.worker}; gateway RSS {r.rss_mb:.0f} MB, {r.fds} fds"
    )


def checks(results: list[Round], probe_bound: float) -> dict[str, tuple[bool, str]]:
    """Each check's verdict and figures."""
    first, last = results[0], results[-1]
    left = sum(r.left for r in results)
    stayed = sum(r.completed for r in results)
    probes = sum(len(r.probes) for r in results)
    w = last.worker  # the worker's counts are cumulative
    loaded = [p for r in results[1:] or results for p in r.probes]
    p99 = percentile(loaded, 0.99)
    rss_growth, fd_growth = last.rss_mb / first.rss_mb - 1, last.fds / first.fds - 1
    errors = [e for r in results for e in r.errors]
    return {
        "every stream whole or left": (
            not errors and stayed + left == sum(r.streams for r in results),
            f"{stayed} whole, {left} left, errors {errors[:3]}",
        ),
        "every engine request ended": (
            w["active"] == 0
            and w["started"] == w["finished"] + w["cancelled"]
            and w["cancelled"] == left
            and w["finished"] == stayed + probes,
            f"worker {w}; clients left {left}, stayed {stayed}, probes {probes}",
        ),
        "RSS and fds back within 10%": (
            rss_growth <= GROWTH_BOUND and fd_growth <= GROWTH_BOUND,
            f"RSS {first.rss_mb:.0f} -> {last.rss_mb:.0f} MB ({rss_growth:+.1%}), "
            f"fds {first.fds} -> {last.fds} ({fd_growth:+.1%})",
        ),
        f"probe p99 under {probe_bound:.1f} s": (
            p99 < probe_bound,
            f"p99 {p99 * 1000:.0f} ms, p50 {percentile(loaded, 0.5) * 1000:.0f} ms "
            f"over {len(loaded)} probes",
        ),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__)
    p.add_argument("--streams", type=int, default=1000, help="concurrent streams per round")
    p.add_argument("--rounds", type=int, default=3, help="rounds (the first warms up)")
    p.add_argument("--probe-p99-bound", type=float, default=PROBE_P99_BOUND, help="seconds")
    p.add_argument("--json", type=Path, help="write the rounds and checks here")
    args = p.parse_args(argv)
    from engine_server.tiny_models import default_cache_root, ensure_model

    model = ensure_model("text", default_cache_root())
    with tempfile.TemporaryDirectory(prefix="mmgate-soak-") as workdir:
        results = asyncio.run(soak(model, args.streams, args.rounds, Path(workdir)))
    verdicts = checks(results, args.probe_p99_bound)
    for name, (ok, figures) in verdicts.items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {figures}")
    if args.json:
        rounds = [{**asdict(r), "probes": len(r.probes)} for r in results]
        report = {"rounds": rounds, "checks": {k: list(v) for k, v in verdicts.items()}}
        args.json.write_text(json.dumps(report, indent=1))
    return 0 if all(ok for ok, _ in verdicts.values()) else 1


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
