"""Throughput and latency of our gateway vs SMG 1.13.0, both in front of the same mock worker.

    python -m benchmarks.gateway_bench [--quick] [--rounds N]
        [--kinds text image chat photo turns] [--no-mixed] [--concurrency 1 32]
        [--output-tokens 16] [--image-max-pixels N] [--ours-env KEY=VALUE] [--json FILE]

Starts `benchmarks.mock_worker` (no model compute: 16 tokens per request), `mmgate serve` and
`smg launch` in front of it, checks that both gateways answer the same text and image chat,
and then runs the same closed-loop loads (`benchmarks.load_gen`, in its own process) against
each, plus a direct baseline: the worker's Generate called over gRPC with the exact request
our gateway sent it (captured by the mock worker), by the gateway's own HTTP/2 client with the
request serialized once (`load_gen --grpc-client`), so that it measures the worker, not a
client. Cases (`benchmarks.workloads` makes the bodies):
- `text` and `image` (one 640x480 JPEG data URI; `--image-max-pixels 12845056` keeps it at
  full size): the same chat every request, streaming and not, at concurrency 1 (latency, 2 s)
  and 32 (throughput, 4 s), our gateway without its media cache;
- `chat` (text, every request different: system prompts, histories, mixed lengths), `photo`
  (a distinct 640x480 JPEG each request) and `turns` (3-turn chats resending a 640x480 and a
  1280x960 image every turn, each conversation its own images): at 32 clients, ours against
  SMG only; `turns` against a second pair of gateways with their media caches on (ours:
  `--mm-processor-cache-gb` at its default, SMG: `--mm-pixel-cache-mb 4096`) in front of a
  second mock worker that advertises an item cache (`--mm-item-cache-mb`), so ours sends each
  image to it once, as in front of `mmgate engine` (SMG sends every turn's pixels);
- `--mixed`: a varied text chat's p99 (4 clients, streamed) alone and while 32 other clients
  send distinct 1280x960 images, through each gateway.
The order of the targets rotates from case to case and from round to round so that load from
elsewhere on the machine does not favour one of them; with three rounds (the default) the
tables show each target's best round (most req/s), since outside load only ever slows a
run down, and the median CPU per request.

For every run it reads the CPU time (user + system, the whole process tree) of the gateway,
the worker and the load generator around the measured window, and reports CPU per request.

Fixture notes (see benchmarks/RESULTS.md): the model is a copy of the tiny random Qwen2-VL
from `engine_server.tiny_models` plus what SMG 1.13.0's Qwen-VL path needs: an `<image>`
token in the tokenizer, `vision_token_id` in config.json (pointing at `<|image_pad|>`) and,
for SMG only, a chat template that renders each image as `<|vision_start|><image><|vision_end|>`.
Both gateways then send the worker the same prompt ids.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc
import httpx
import psutil

from benchmarks.bench_report import TARGETS, mixed_table, mixed_verdict, print_report
from benchmarks.load_gen import chat_body
from protos import vllm_engine_pb2 as pb
from protos import vllm_engine_pb2_grpc as pb_grpc

VENV_BIN = Path(sys.executable).parent
IMAGE_ANCHOR = "<image>"
QWEN_IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
SMG_IMAGE = f"<|vision_start|>{IMAGE_ANCHOR}<|vision_end|>"
THROUGHPUT_CONCURRENCY = 32
LOAD_TIMEOUT = 120.0
FIXED_KINDS = ("text", "image")  # one body again and again; the others differ per request
ALL_KINDS = (*FIXED_KINDS, "chat", "photo", "turns")
CACHED_KINDS = ("turns",)  # served by the gateways with their media caches on
CACHE = "+cache"  # the suffix of those gateways' service names
SMG_PIXEL_CACHE_MB = 4096  # as ours: --mm-processor-cache-gb defaults to 4
MIXED_TEXT_CONCURRENCY = 4


# ---- configuration ----


@dataclass
class BenchConfig:
    kinds: tuple[str, ...] = ALL_KINDS
    mixed: bool = True
    streams: tuple[bool, ...] = (True, False)
    concurrencies: tuple[int, ...] = (1, THROUGHPUT_CONCURRENCY)
    latency_seconds: float = 2.0
    throughput_seconds: float = 4.0
    rounds: int = 1
    output_tokens: int = 16
    image_max_pixels: int | None = None  # None: the fixture's own (50176, 224x224)
    ours_env: dict[str, str] = field(default_factory=dict)

    def seconds_for(self, concurrency: int) -> float:
        return self.latency_seconds if concurrency == 1 else self.throughput_seconds


@dataclass
class Case:
    kind: str
    stream: bool
    concurrency: int

    @property
    def label(self) -> str:
        cache = " cached" if self.cached else ""
        return f"{self.kind}{cache} {'stream' if self.stream else 'full'} c={self.concurrency}"

    @property
    def cached(self) -> bool:
        return self.kind in CACHED_KINDS

    def service(self, target: str) -> str:
        """The gateway serving this case for `target` ("ours", "smg" or "direct")."""
        return target + CACHE if self.cached and target != "direct" else target

    @property
    def targets(self) -> tuple[str, ...]:
        """The direct baseline replays one captured request: fixed loads only."""
        return TARGETS if self.kind in FIXED_KINDS else TARGETS[:2]


@dataclass
class RunResult:
    target: str
    case: Case
    load: dict
    gateway_cpu_s: float
    worker_cpu_s: float
    gateway_thread_cpu_s: dict[int, float] = field(default_factory=dict)

    def per_request_ms(self, cpu_seconds: float) -> float:
        requests = self.load["requests"]
        return 1000 * cpu_seconds / requests if requests else 0.0


# ---- processes ----


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and its children (0 once it is gone)."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            times = process.cpu_times()
            total += times.user + times.system
    return total


@dataclass
class Service:
    name: str
    process: subprocess.Popen
    log_path: Path

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def launch(name: str, cmd: list[str], workdir: Path, env: dict[str, str] | None = None) -> Service:
    log_path = workdir / f"{name}.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "NO_COLOR": "1", **(env or {})},
            start_new_session=True,
        )
    return Service(name, process, log_path)


def wait_until(check, service: Service, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if service.process.poll() is not None:
            break
        with contextlib.suppress(Exception):
            if check():
                return
        time.sleep(0.25)
    raise RuntimeError(f"{service.name} did not become ready:\n{service.log_tail()}")


def worker_ready(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.VllmEngineStub(channel)
        return stub.HealthCheck(pb.HealthCheckRequest(), timeout=2).healthy


def models_ready(base: str) -> bool:
    return bool(httpx.get(f"{base}/v1/models", timeout=2).json().get("data"))


# ---- the fixture model ----


def build_fixture_model(workdir: Path, max_pixels: int | None = None) -> tuple[Path, Path]:
    """A copy of the tiny Qwen2-VL that SMG 1.13.0 can also serve; returns (dir, SMG template).
    `max_pixels` replaces the image processor's limit (Qwen2-VL's own default is 12845056)."""
    from engine_server.tiny_models import ensure_model

    source = ensure_model("vision")
    model = workdir / "qwen2-vl-tiny"
    model.mkdir()
    for path in source.iterdir():
        if path.is_file() and path.suffix != ".safetensors":
            shutil.copy(path, model / path.name)
    anchor_id = add_image_anchor_token(model / "tokenizer.json")
    config = json.loads((model / "config.json").read_text())
    config["vision_token_id"] = config["image_token_id"]
    config["text_config"]["vocab_size"] = max(config["text_config"]["vocab_size"], anchor_id + 1)
    (model / "config.json").write_text(json.dumps(config, indent=2))
    if max_pixels is not None:
        set_max_pixels(model / "preprocessor_config.json", max_pixels)
    template = (model / "chat_template.jinja").read_text()
    smg_template = workdir / "smg_chat_template.jinja"
    smg_template.write_text(template.replace(QWEN_IMAGE, SMG_IMAGE))
    return model, smg_template


def set_max_pixels(path: Path, max_pixels: int) -> None:
    preprocessor = json.loads(path.read_text())
    preprocessor["max_pixels"] = preprocessor["size"]["longest_edge"] = max_pixels
    path.write_text(json.dumps(preprocessor, indent=2))


def add_image_anchor_token(tokenizer_path: Path) -> int:
    tokenizer = json.loads(tokenizer_path.read_text())
    added = tokenizer["added_tokens"]
    anchor_id = max(t["id"] for t in added) + 1
    added.append({**added[-1], "id": anchor_id, "content": IMAGE_ANCHOR})
    tokenizer_path.write_text(json.dumps(tokenizer))
    return anchor_id


# ---- the three targets ----


@dataclass
class Stack:
    workdir: Path
    model: Path
    worker_address: str
    bases: dict[str, str]
    services: dict[str, Service]
    capture_dir: Path

    def pid_for(self, target: str) -> int | None:
        service = self.services.get(target)
        return service.process.pid if service else None


def start_stack(
    workdir: Path, config: BenchConfig, gateways: tuple[str, ...] = ("ours", "smg")
) -> Stack:
    """The mock worker, then the gateways in front of it, each ready to serve: `gateways`,
    and the same with their media caches on when a case needs them."""
    if any(kind in CACHED_KINDS for kind in config.kinds):
        gateways = (*gateways, *(name + CACHE for name in gateways))
    model, smg_template = build_fixture_model(workdir, config.image_max_pixels)
    capture_dir = workdir / "captured"
    capture_dir.mkdir()
    worker_port = free_port()
    address = f"127.0.0.1:{worker_port}"
    worker_cmd = mock_worker_cmd(model, worker_port, capture_dir, config)
    stack = Stack(
        workdir, model, address, {}, {"worker": launch("worker", worker_cmd, workdir)}, capture_dir
    )
    try:
        wait_until(lambda: worker_ready(address), stack.services["worker"])
        cached_address = start_cached_worker(stack, config) if len(gateways) > 2 else address
        for name in gateways:
            port = free_port()
            stack.bases[name] = f"http://127.0.0.1:{port}"
            cache = name.endswith(CACHE)
            worker = cached_address if cache else address
            if name.startswith("ours"):
                command = ours_cmd(model, worker, port, cache)
                stack.services[name] = launch(name, command, workdir, config.ours_env)
            else:
                command = smg_cmd(worker, port, smg_template, cache)
                stack.services[name] = launch(name, command, workdir)
        for name in gateways:
            wait_until(lambda name=name: models_ready(stack.bases[name]), stack.services[name])
    except BaseException:
        stop_stack(stack)  # a gateway that fails to start must not leave the worker behind
        raise
    return stack


def start_cached_worker(stack: Stack, config: BenchConfig) -> str:
    """A second mock worker for the gateways with their caches on, advertising an item cache
    (send each image once: ours uses it, SMG does not know it). The first worker advertises
    none, so the uncached cases still send every request's tensors."""
    port = free_port()
    capture_dir = stack.capture_dir / "cached"
    capture_dir.mkdir()
    command = [
        *mock_worker_cmd(stack.model, port, capture_dir, config), "--mm-item-cache-mb", "4096"
    ]  # fmt: skip
    stack.services["worker-cache"] = launch("worker-cache", command, stack.workdir)
    address = f"127.0.0.1:{port}"
    wait_until(lambda: worker_ready(address), stack.services["worker-cache"])
    return address


def mock_worker_cmd(model: Path, port: int, capture_dir: Path, config: BenchConfig) -> list[str]:
    return [
        sys.executable, "-m", "benchmarks.mock_worker", "--model", str(model),
        "--port", str(port), "--capture-dir", str(capture_dir),
        "--output-tokens", str(config.output_tokens),
    ]  # fmt: skip


def ours_cmd(model: Path, worker: str, port: int, cache: bool = False) -> list[str]:
    # Without `cache`, no media cache: the fixed image load sends one image again and again,
    # which a cache would answer from memory; it measures each request's own preprocessing,
    # as SMG (no pixel cache by default) does it. With it, the default cache size.
    cmd = [
        str(VENV_BIN / "mmgate"), "serve", "--model", str(model),
        "--worker", f"grpc://{worker}", "--port", str(port),
    ]  # fmt: skip
    return cmd if cache else [*cmd, "--mm-processor-cache-gb", "0"]


def smg_cmd(worker: str, port: int, chat_template: Path, cache: bool = False) -> list[str]:
    pixel_cache = ["--mm-pixel-cache-mb", str(SMG_PIXEL_CACHE_MB)] if cache else []
    return [
        str(VENV_BIN / "smg"), "launch", "--host", "127.0.0.1", "--port", str(port),
        "--worker-urls", f"grpc://{worker}",
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
        "--chat-template", str(chat_template),
        "--multimodal-tensor-transport", "inline",
        "--shutdown-grace-period-secs", "1", *pixel_cache,
    ]  # fmt: skip


def stop_stack(stack: Stack) -> None:
    for name, service in stack.services.items():  # the worker, started first, stops last
        if name != "worker":
            service.stop()
    if "worker" in stack.services:
        stack.services["worker"].stop()


# ---- sanity: both gateways give the same answer, and the direct baseline gets its request ----


def check_answers(stack: Stack, config: BenchConfig) -> dict[str, dict]:
    """One non-streaming request per kind through each gateway; returns what they answered.

    The `X-Request-Id: capture-<target>-<kind>` header makes the mock worker keep the
    GenerateRequest each gateway sent (ours is replayed by the direct baseline)."""
    seen: dict[str, dict] = {}
    for kind in checked_kinds(config):
        for target in ("ours", "smg"):
            body = chat_body(kind, str(stack.model), False, config.output_tokens)
            headers = {"x-request-id": f"capture-{target}-{kind}"}
            url = f"{stack.bases[target]}/v1/chat/completions"
            reply = httpx.post(url, json=body, headers=headers, timeout=60)
            if reply.status_code != 200:
                raise RuntimeError(f"{target} refused {kind} chat: {reply.text[:500]}")
            answer = reply.json()
            seen[f"{target}/{kind}"] = {
                "content": answer["choices"][0]["message"]["content"],
                "prompt_tokens": answer["usage"]["prompt_tokens"],
                "completion_tokens": answer["usage"]["completion_tokens"],
            }
    return seen


def checked_kinds(config: BenchConfig) -> tuple[str, ...]:
    """The kinds whose first request is compared: the fixed ones and the varied text chat
    (a system prompt and a history)."""
    return tuple(k for k in config.kinds if k in (*FIXED_KINDS, "chat"))


def captured_request(stack: Stack, target: str, kind: str) -> pb.GenerateRequest | None:
    found = sorted(stack.capture_dir.glob(f"capture-{target}-{kind}*.bin"))
    return pb.GenerateRequest.FromString(found[0].read_bytes()) if found else None


def describe_request(request: pb.GenerateRequest | None) -> str:
    if request is None:
        return "not captured"
    pixels = request.mm_inputs.pixel_values
    shape = "x".join(map(str, pixels.shape)) if request.HasField("mm_inputs") else ""
    image = f", pixels {shape} {pixels.dtype} {pixels.WhichOneof('payload')}" if shape else ""
    return f"{len(request.tokenized.input_ids)} ids{image}, stream={request.stream}"


def report_answers(stack: Stack, seen: dict[str, dict], kinds: tuple[str, ...]) -> None:
    for kind in kinds:
        ours, smg = seen[f"ours/{kind}"], seen[f"smg/{kind}"]
        sent = {t: captured_request(stack, t, kind) for t in ("ours", "smg")}
        same_ids = all(sent.values()) and (
            sent["ours"].tokenized.input_ids == sent["smg"].tokenized.input_ids
        )
        print(f"  {kind}: same answer text and usage: {ours == smg}; "
              f"same prompt ids to the worker: {same_ids}")  # fmt: skip
        for target in ("ours", "smg"):
            print(f"    {target} sent: {describe_request(sent[target])}")


# ---- one load run ----


def load_cmd(stack: Stack, target: str, case: Case, seconds: float, max_tokens: int) -> list[str]:
    cmd = [
        sys.executable, "-m", "benchmarks.load_gen", "--kind", case.kind,
        "--concurrency", str(case.concurrency), "--duration", str(seconds), "--wait-for-go",
        "--max-tokens", str(max_tokens),
    ]  # fmt: skip
    if case.stream:
        cmd.append("--stream")
    if target == "direct":
        captured = stack.capture_dir / f"capture-ours-{case.kind}.bin"
        return [*cmd, "--target", f"grpc://{stack.worker_address}", "--grpc-request", str(captured)]
    return [*cmd, "--target", stack.bases[case.service(target)], "--model", str(stack.model)]


def run_load(
    stack: Stack, target: str, case: Case, seconds: float, max_tokens: int = 16
) -> RunResult:
    """One load-generator run; CPU counters are read around its measured window only."""
    gateway_pid = stack.pid_for(case.service(target))
    cached = case.service(target).endswith(CACHE) and "worker-cache" in stack.services
    worker_pid = stack.services["worker-cache" if cached else "worker"].process.pid
    with subprocess.Popen(
        load_cmd(stack, target, case, seconds, max_tokens),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as load:
        if load.stdout.readline().strip() != "warm":
            raise RuntimeError(f"the load generator failed to warm up against {target}")
        before = cpu_snapshot(gateway_pid, worker_pid)
        threads_before = thread_cpu_seconds(gateway_pid)
        load.stdin.write("go\n")
        load.stdin.flush()
        line = load.stdout.readline()
        after = cpu_snapshot(gateway_pid, worker_pid)
        threads_after = thread_cpu_seconds(gateway_pid)
        load.wait(timeout=LOAD_TIMEOUT)
    gateway_cpu, worker_cpu = (b - a for a, b in zip(before, after))
    threads = {t: cpu - threads_before.get(t, 0.0) for t, cpu in threads_after.items()}
    return RunResult(target, case, json.loads(line), gateway_cpu, worker_cpu, threads)


def cpu_snapshot(gateway_pid: int | None, worker_pid: int) -> tuple[float, float]:
    gateway = tree_cpu_seconds(gateway_pid) if gateway_pid else 0.0
    return gateway, tree_cpu_seconds(worker_pid)


def thread_cpu_seconds(pid: int | None) -> dict[int, float]:
    """Per thread id of one process: user + system CPU seconds so far."""
    if pid is None:
        return {}
    try:
        return {t.id: t.user_time + t.system_time for t in psutil.Process(pid).threads()}
    except psutil.NoSuchProcess:
        return {}


def progress(run: RunResult) -> None:
    load = run.load
    errors = f" ERRORS {load['errors']}: {load['first_error'][:120]}" if load["errors"] else ""
    gateway_cpu = (
        ""
        if run.target == "direct"
        else f"gateway {run.per_request_ms(run.gateway_cpu_s):.3f} ms CPU/req"
    )
    print(
        f"  {run.case.label:<20} {run.target:<6} {load['rps']:>7.1f} req/s  "
        f"p50 {load['p50_ms']:>7.2f} ms  p99 {load['p99_ms']:>7.2f} ms  "
        f"{gateway_cpu}{errors}",
        flush=True,
    )


# ---- the plan ----


def cases(config: BenchConfig) -> list[Case]:
    """Every kind, stream or not, at every concurrency; the loads whose requests differ at
    the throughput concurrency only (their goals are about req/s and CPU under load)."""
    return [
        Case(kind, stream, concurrency)
        for concurrency in config.concurrencies
        for kind in config.kinds
        for stream in config.streams
        if kind in FIXED_KINDS or concurrency == THROUGHPUT_CONCURRENCY
    ]


def target_order(turn: int, round_index: int, targets: tuple[str, ...] = TARGETS) -> list[str]:
    """Every target in every position: rotated per case and per round, reversed every other."""
    shift = (turn + round_index) % len(targets)
    order = list(targets[shift:] + targets[:shift])
    return order[::-1] if round_index % 2 else order


def run_all(stack: Stack, config: BenchConfig) -> list[RunResult]:
    results = []
    for round_index in range(config.rounds):
        print(f"round {round_index + 1}/{config.rounds}", flush=True)
        for turn, case in enumerate(cases(config)):
            for target in target_order(turn, round_index, case.targets):
                seconds = config.seconds_for(case.concurrency)
                run = run_load(stack, target, case, seconds, config.output_tokens)
                progress(run)
                results.append(run)
    return results


# ---- text under image load ----


def run_mixed(stack: Stack, config: BenchConfig) -> list[dict]:
    """Per round and gateway: a varied text chat's figures alone, then while 32 other clients
    send distinct 1280x960 images (the image load warms up first and outlasts the text)."""
    text = Case("chat", True, MIXED_TEXT_CONCURRENCY)
    images = Case("photo-large", True, THROUGHPUT_CONCURRENCY)
    seconds = config.throughput_seconds
    runs = []
    for round_index in range(config.rounds):
        for target in target_order(0, round_index, ("ours", "smg")):
            alone = run_load(stack, target, text, seconds, config.output_tokens).load
            # long enough to cover the text load's warm-up and measured window
            cmd = load_cmd(stack, target, images, 2 * seconds + 8, config.output_tokens)
            with subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            ) as bg:
                if bg.stdout.readline().strip() != "warm":
                    raise RuntimeError(f"the image load failed to warm up against {target}")
                bg.stdin.write("go\n")
                bg.stdin.flush()
                time.sleep(1.0)
                under = run_load(stack, target, text, seconds, config.output_tokens).load
                image_load = json.loads(bg.stdout.readline())
                bg.wait(timeout=LOAD_TIMEOUT)
            runs.append({"target": target, "alone": alone, "under": under, "images": image_load})
            errors = alone["errors"] + under["errors"] + image_load["errors"]
            print(
                f"  text under images  {target:<6} p99 alone {alone['p99_ms']:.2f} ms, "
                f"under {under['p99_ms']:.2f} ms; images {image_load['rps']:.1f} req/s"
                f"{f' ERRORS {errors}' if errors else ''}",
                flush=True,
            )
    return runs


# ---- machine ----


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.machine()


def machine_notes() -> str:
    load1, load5, load15 = os.getloadavg()
    return (
        f"{os.cpu_count()} CPUs ({cpu_model()}), Python {platform.python_version()}, "
        f"load average {load1:.2f} / {load5:.2f} / {load15:.2f}"
    )


def source_version() -> str:
    """The commit measured, "-dirty" when the working tree has uncommitted changes."""
    cmd = ["git", "describe", "--always", "--dirty"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).parent)
    return done.stdout.strip() or "unknown"


# ---- entry point ----


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gateway_bench", description=__doc__)
    p.add_argument("--quick", action="store_true", help="streaming only, short runs (< 1 min)")
    p.add_argument(
        "--rounds", type=int, help="repeat every run, order rotated (default: 3, quick: 1)"
    )
    p.add_argument(
        "--kinds",
        nargs="+",
        choices=ALL_KINDS,
        default=list(ALL_KINDS),
        help="text, image: one body again and again; chat (text), photo (640x480), turns "
        "(3-turn chats, two images, caches on): every request different",
    )
    p.add_argument(
        "--mixed",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="text p99 alone and under 32 clients' image load (default: on)",
    )
    p.add_argument("--output-tokens", type=int, default=16, help="tokens per request")
    p.add_argument(
        "--image-max-pixels",
        type=int,
        help="the image processor's max_pixels (default: the fixture's 50176, so the 640x480 "
        "image becomes 252x168; 12845056, Qwen2-VL's own, keeps it at full size)",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        nargs="+",
        default=[1, THROUGHPUT_CONCURRENCY],
        help="client concurrencies to run (default: 1 32)",
    )
    p.add_argument(
        "--ours-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="environment for our gateway only (e.g. OPENBLAS_NUM_THREADS=1)",
    )
    p.add_argument("--keep", action="store_true", help="keep the work dir (logs, captures)")
    p.add_argument("--json", type=Path, help="write every figure here")
    return p


def config_from(args: argparse.Namespace) -> BenchConfig:
    config = BenchConfig(
        kinds=tuple(args.kinds),
        mixed=args.mixed,
        concurrencies=tuple(args.concurrency),
        rounds=args.rounds or (1 if args.quick else 3),
        output_tokens=args.output_tokens,
        image_max_pixels=args.image_max_pixels,
        ours_env=dict(item.split("=", 1) for item in args.ours_env),
    )
    if args.quick:
        config.streams = (True,)
        config.latency_seconds, config.throughput_seconds = 1.5, 2.5
    return config


@contextlib.contextmanager
def work_dir(keep: bool) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
    try:
        yield path
    finally:
        if keep:
            print(f"work dir kept: {path}")
        else:
            shutil.rmtree(path, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config = config_from(args)
    started = time.monotonic()
    print(f"machine: {machine_notes()}; source: {source_version()}", flush=True)
    with work_dir(args.keep) as workdir:
        print(f"starting the mock worker, mmgate serve and SMG in {workdir} ...", flush=True)
        stack = start_stack(workdir, config)
        try:
            print(f"ready after {time.monotonic() - started:.1f} s; checking answers:", flush=True)
            report_answers(stack, check_answers(stack, config), checked_kinds(config))
            results = run_all(stack, config)
            mixed = run_mixed(stack, config) if config.mixed else []
            figures = print_report(results, cases(config))
            if mixed:
                print("\ntext under image load:\n\n" + mixed_table(mixed) + "\n")
                print(mixed_verdict(mixed))
            figures["mixed"] = mixed
        finally:
            stop_stack(stack)
    print(f"\ntotal {time.monotonic() - started:.0f} s; machine after: {machine_notes()}")
    if args.json:
        args.json.write_text(json.dumps({"config": asdict(config), "results": figures}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
