"""Where our gateway's CPU goes under load: py-spy samples, grouped by stage.

    python -m benchmarks.profile_gateway [--kinds text image chat ...] [--full] [--seconds 8]
        [--keep]

Starts the mock worker and `mmgate serve` (as `benchmarks.gateway_bench` does), drives each
kind of streaming chat (`--full`: non-streamed) at concurrency 32 with `benchmarks.load_gen`,
and records the gateway with `py-spy record --threads` (Python frames, 50 Hz; `--nonblocking`
samples without pausing the gateway but may read torn stacks).

The gateway's CPU time per request is first split by thread, from the kernel's per-thread
counters (/proc) over the measured window: the main thread (event loop: HTTP, gRPC client
calls, detokenizing, ...), the asyncio.to_thread pool (image decode and preprocessing), the
gRPC poller thread and gRPC's C-core threads. py-spy counts the poller thread, which waits in
epoll inside C, and idle pool threads (blocked in queue.get) as busy, so those samples are
dropped. Each remaining sample is put in the stage of the innermost frame that names one (the
resize kernel, the gRPC client, the ASGI stack, JSON, ...); a stage's "CPU ms per request" is
its share of its thread group's samples times that group's CPU per request. The top frames by
self samples follow. A pool thread waiting to take the GIL back (after decoding, say) still
looks busy to py-spy, so the pool's shares lean towards the frames that release the GIL.

Needs py-spy in the venv (`pip install py-spy`) or on PATH; it slows the gateway down a little.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.gateway_bench import (
    ALL_KINDS,
    CACHED_KINDS,
    VENV_BIN,
    BenchConfig,
    Case,
    RunResult,
    Stack,
    run_load,
    start_stack,
    stop_stack,
    work_dir,
)

SAMPLE_RATE = 50
PY_SPY = str(VENV_BIN / "py-spy") if (VENV_BIN / "py-spy").exists() else shutil.which("py-spy")
CONCURRENCY = 32
# Leaf frames of threads that py-spy reports busy while they wait (in C, or on a queue lock).
IDLE_LEAVES = ("(threading.py:982)", "(concurrent/futures/thread.py:81)")
MAIN, POOL, POLLER, CORE = (
    "main thread (event loop)",
    "to_thread pool",
    "gRPC poller thread",
    "gRPC C-core threads",
)
# (substring of a py-spy frame "function (file:line)", stage); the innermost match wins.
STAGES: tuple[tuple[str, str], ...] = (
    ("multimodal/resize", "image: resize (numpy)"),
    ("multimodal/native.py", "image: resize + patches (native kernels)"),
    ("multimodal/processors/", "image: processor (patches, normalize)"),
    ("multimodal/hashing.py", "image: hash (blake3)"),
    ("multimodal/wire.py", "image: tensors to proto"),
    ("multimodal/decode.py", "image: decode (PIL)"),
    ("PIL/", "image: decode (PIL)"),
    ("multimodal/media.py", "image: load (data URI, base64)"),
    ("multimodal/", "image: other"),
    ("gateway/transport/", "gRPC client (ours, streams)"),
    ("gateway/stream/detokenizer.py", "detokenize"),
    ("gateway/render/", "chat template + tokenize"),
    ("jinja2/", "chat template + tokenize"),
    ("tokenizers", "chat template + tokenize"),
    ("json/", "JSON encode/decode"),
    ("pydantic", "request validation (pydantic)"),
    ("logging/", "logging"),
    ("gateway/observability/request_log.py", "logging"),
    ("gateway/observability/metrics.py", "metrics"),
    ("prometheus", "metrics"),
    ("grpc/", "gRPC client (grpc.aio)"),
    ("google/protobuf", "protobuf"),
    ("gateway/stream/generation.py", "gateway: stream accumulation"),
    ("gateway/api/chat.py", "gateway: chat service + SSE"),
    ("gateway/", "gateway: other"),
    ("uvicorn/", "HTTP server + ASGI stack"),
    ("starlette/", "HTTP server + ASGI stack"),
    ("fastapi/", "HTTP server + ASGI stack"),
    ("anyio/", "HTTP server + ASGI stack"),
    ("concurrent/futures", "thread pool"),
    ("asyncio/", "event loop (uvloop, socket I/O)"),
)


@dataclass
class Samples:
    """One thread group's busy samples: by stage and by leaf frame."""

    stages: collections.Counter = field(default_factory=collections.Counter)
    leaves: collections.Counter = field(default_factory=collections.Counter)

    @property
    def total(self) -> int:
        return sum(self.stages.values())

    def add(self, frames: list[str], count: int) -> None:
        self.stages[stage_of(frames)] += count
        self.leaves[frames[-1]] += count


@dataclass
class Profile:
    kind: str
    stream: bool
    samples: dict[str, Samples]
    threads_ms: dict[str, float]
    rps: float


def stage_of(frames: list[str]) -> str:
    for frame in reversed(frames):
        for pattern, stage in STAGES:
            if pattern in frame:
                return stage
    return "other"


def sample_group(thread_frame: str) -> str:
    """`thread (TID): NAME`, py-spy's root frame with --threads, to a thread group."""
    name = thread_frame.partition(": ")[2]
    if name == "MainThread":
        return MAIN
    return POLLER if "_poll_wrapper" in name else POOL


def read_folded(path: Path) -> dict[str, Samples]:
    groups: dict[str, Samples] = collections.defaultdict(Samples)
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if len(frames) < 2 or frames[-1].endswith(IDLE_LEAVES):
            continue  # no Python frame, or a thread that waits
        groups[sample_group(frames[0])].add(frames[1:], int(count))
    return dict(groups)


def profile_kind(
    stack: Stack, case: Case, seconds: float, out: Path, nonblocking: bool = False
) -> Profile:
    pid = stack.services["ours"].process.pid
    extra = ["--nonblocking"] if nonblocking else []
    spy = subprocess.Popen(
        [PY_SPY, "record", "-p", str(pid), "-r", str(SAMPLE_RATE),
         "-d", str(int(seconds) + 2), "--threads", "-f", "raw", "-o", str(out), *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    run = run_load(stack, "ours", case, seconds)
    names = thread_names(pid)
    spy.wait(timeout=seconds + 30)
    cpu = threads_ms(run, pid, names)
    return Profile(case.kind, case.stream, read_folded(out), cpu, run.load["rps"])


def thread_names(pid: int) -> dict[int, str]:
    """Python thread names by thread id (py-spy dump); C-only threads are not listed."""
    dump = subprocess.run(
        [PY_SPY, "dump", "--pid", str(pid)], capture_output=True, text=True
    ).stdout
    return {int(tid): name for tid, name in re.findall(r'^Thread (\d+) .*?"(.*)"', dump, re.M)}


def thread_group(tid: int, pid: int, names: dict[int, str]) -> str:
    name = names.get(tid)
    if tid == pid:
        return MAIN
    if name is None:
        return CORE
    return POLLER if "_poll_wrapper" in name else POOL


def threads_ms(run: RunResult, pid: int, names: dict[int, str]) -> dict[str, float]:
    grouped: dict[str, float] = collections.defaultdict(float)
    for tid, seconds in run.gateway_thread_cpu_s.items():
        grouped[thread_group(tid, pid, names)] += run.per_request_ms(seconds)
    return dict(grouped)


def thread_table(profile: Profile) -> str:
    total = sum(profile.threads_ms.values())
    rows = [
        f"**{profile.kind}** ({'stream' if profile.stream else 'full'}, c={CONCURRENCY}): "
        f"{profile.rps:.0f} req/s under py-spy, "
        f"{total:.2f} ms gateway CPU per request\n",
        "| thread | CPU ms/request |",
        "|---|---|",
    ]
    for group in (MAIN, POOL, POLLER, CORE):
        if group in profile.threads_ms:
            rows.append(f"| {group} | {profile.threads_ms[group]:.2f} |")
    return "\n".join(rows)


def stage_table(profile: Profile, group: str) -> str:
    samples, cpu_ms = profile.samples[group], profile.threads_ms.get(group, 0.0)
    rows = [
        f"{group} by stage ({samples.total} samples):\n",
        "| stage | share of samples | ≈ CPU ms/request |",
        "|---|---|---|",
    ]
    for stage, count in samples.stages.most_common():
        share = count / samples.total
        rows.append(f"| {stage} | {100 * share:.1f}% | {share * cpu_ms:.2f} |")
    return "\n".join(rows)


def top_frames(profile: Profile, group: str, count: int = 12) -> str:
    samples = profile.samples[group]
    rows = [f"| {group}: self samples | frame |", "|---|---|"]
    for frame, hits in samples.leaves.most_common(count):
        rows.append(f"| {100 * hits / samples.total:.1f}% | `{_short(frame)}` |")
    return "\n".join(rows)


def report(profile: Profile) -> str:
    tables = [thread_table(profile)]
    for group in (MAIN, POOL):
        if profile.samples.get(group):
            tables += [stage_table(profile, group), top_frames(profile, group)]
    return "\n\n".join(tables)


def _short(frame: str) -> str:
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    for marker in ("site-packages/", "/lib/python3"):
        if marker in where:
            where = where.split(marker, 1)[1]
    return f"{name} ({where})"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.profile_gateway", description=__doc__)
    uncached = [k for k in ALL_KINDS if k not in CACHED_KINDS]
    p.add_argument("--kinds", nargs="+", choices=uncached, default=["text", "image"])
    p.add_argument("--full", action="store_true", help="non-streamed requests")
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--nonblocking", action="store_true", help="do not pause the gateway")
    p.add_argument("--ours-env", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--keep", action="store_true", help="keep the work dir (folded stacks)")
    p.add_argument("--json", type=Path, help="write the stage shares here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if PY_SPY is None:
        sys.exit("py-spy is not installed: PIP_CONFIG_FILE=/dev/null .venv/bin/pip install py-spy")
    config = BenchConfig(kinds=tuple(args.kinds))
    config.ours_env = dict(item.split("=", 1) for item in args.ours_env)
    profiles = []
    with work_dir(args.keep) as workdir:
        stack = start_stack(workdir, config, gateways=("ours",))
        try:
            for kind in args.kinds:
                print(f"profiling {kind} ...", flush=True)
                out = workdir / f"{kind}.folded"
                case = Case(kind, not args.full, CONCURRENCY)
                profiles.append(profile_kind(stack, case, args.seconds, out, args.nonblocking))
        finally:
            stop_stack(stack)
    for profile in profiles:
        print("\n" + report(profile))
    if args.json:
        shares = {
            p.kind: {
                "threads_ms": p.threads_ms,
                "stages": {g: dict(samples.stages) for g, samples in p.samples.items()},
            }
            for p in profiles
        }
        args.json.write_text(json.dumps(shares, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
