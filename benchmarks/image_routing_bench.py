"""Image-aware cache routing, measured as vLLM's prefix-cache hit rate on two real engines.

Two `mmgate engine` workers on a tiny random-weight model (InternVL 3 from tests/support by
default), prefix caching on (block size 32), both publishing their KV events
(--kv-events-config), behind one `mmgate serve` per policy. (`--family qwen2_vl` runs the tiny
Qwen2-VL, whose engine core dies with KeyError 'image_grid_thw' in its M-RoPE positions on a
follow-up turn whose image lies wholly in the prefix-cached blocks: with `mmgate engine` and
with vLLM's own gRPC server alike, not with `vllm serve`'s own processor.)

The workload is multi-turn image chat: `--conversations` chats (an odd number, so that round
robin cannot land a chat on the same worker every turn by parity), each turn resending the
whole history with its images; turn 1 sends an image, turn 2 another, later turns text only.
Every chat has the same system prompt and the same questions: the images alone tell them apart,
so a router that ignores image content sees one conversation. The rounds go turn by turn across
the chats (turn 1 of every chat, then turn 2, ...), one request at a time.

The hit rate is vLLM's own count: usage.prompt_tokens_details.cached_tokens over prompt_tokens,
summed over the follow-up turns (turn 1 of a chat has nothing of its own to hit).

    python -m benchmarks.image_routing_bench [--conversations 5] [--turns 3] [--no-kv-events]
"""

from __future__ import annotations

import argparse
import base64
import io
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine_server.tiny_models import ensure_model  # noqa: E402
from tests.support.engines import UpstreamServicerProcess, WorkerProcess  # noqa: E402
from tests.support.gateway_process import GatewayProcess  # noqa: E402

SYSTEM = "You are a careful visual assistant. " + " ".join(
    f"Rule {i}: be brief." for i in range(12)
)
QUESTIONS = ["What is in this picture?", "And how does this one compare?", "Summarize both."]


def image_uri(seed: int, size: int) -> str:
    """A distinct photo-like JPEG (the same size for every chat: the same placeholder count)."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)
    pixels = np.kron(base, np.ones((size // 8, size // 8, 1), dtype=np.uint8))
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=90)
    return "data:image/jpeg;base64," + base64.b64encode(out.getvalue()).decode()


def user_turn(text: str, image: str | None) -> dict:
    if image is None:
        return {"role": "user", "content": text}
    parts = [{"type": "image_url", "image_url": {"url": image}}, {"type": "text", "text": text}]
    return {"role": "user", "content": parts}


def run_workload(base_url: str, conversations: int, turns: int, size: int, seed: int) -> dict:
    histories = [[{"role": "system", "content": SYSTEM}] for _ in range(conversations)]
    prompt = cached = first_prompt = first_cached = 0
    with httpx.Client(timeout=300) as client:
        model = client.get(f"{base_url}/v1/models").json()["data"][0]["id"]
        for turn in range(turns):
            for chat, history in enumerate(histories):
                image = image_uri(seed + 100 * chat + turn, size) if turn < 2 else None
                history.append(user_turn(QUESTIONS[turn % len(QUESTIONS)], image))
                body = {"model": model, "messages": history, "max_tokens": 4, "temperature": 0}
                reply = client.post(f"{base_url}/v1/chat/completions", json=body)
                reply.raise_for_status()
                data = reply.json()
                usage = data["usage"]
                hit = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
                if turn == 0:
                    first_prompt += usage["prompt_tokens"]
                    first_cached += hit
                else:
                    prompt += usage["prompt_tokens"]
                    cached += hit
                answer = data["choices"][0]["message"]["content"] or "ok"
                history.append({"role": "assistant", "content": answer})
    return {
        "follow_up_hit_rate": cached / prompt if prompt else 0.0,
        "follow_up_prompt_tokens": prompt,
        "follow_up_cached_tokens": cached,
        "first_turn_hit_rate": first_cached / first_prompt if first_prompt else 0.0,
    }


def requests_per_worker(base_url: str) -> list[int]:
    """The gateway's mmgate_worker_requests_total per worker (retries included)."""
    counts = []
    for line in httpx.get(f"{base_url}/metrics", timeout=10).text.splitlines():
        if line.startswith("mmgate_worker_requests_total{"):
            counts.append(int(float(line.rpartition(" ")[2])))
    return sorted(counts, reverse=True)


def kv_events_config(directory: Path) -> dict:
    return {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"ipc://{directory}/events",
        "replay_endpoint": f"ipc://{directory}/replay",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.image_routing_bench")
    parser.add_argument("--conversations", type=int, default=5)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--image-size", type=int, default=336, help="pixels a side")
    parser.add_argument(
        "--block-size", type=int, default=32, help="vLLM's (its CPU default, 128, is coarse)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policies", default="cache_aware,round_robin")
    parser.add_argument("--no-kv-events", action="store_true", help="engines publish none")
    parser.add_argument(
        "--family",
        choices=("qwen2_vl", "internvl"),
        default="internvl",
        help="the tiny model: InternVL 3 (tests/support) or Qwen2-VL (see above)",
    )
    parser.add_argument(
        "--engine",
        choices=("mmgate", "upstream"),
        default="mmgate",
        help="the workers: `mmgate engine`, or vLLM's gRPC server (smg-grpc-servicer)",
    )
    args = parser.parse_args(argv)
    logs = Path(tempfile.mkdtemp(prefix="image-routing-"))
    extra = {"block_size": args.block_size, "limit_mm_per_prompt": {"image": 4}}
    if args.family == "internvl":
        from tests.support.internvl_models import build_model

        model = build_model(logs / "model")
        extra["max_model_len"] = 8192
    else:
        model = ensure_model("vision")
    workers = []
    for name in ("a", "b"):
        (logs / name).mkdir()
        events = {} if args.no_kv_events else {"kv_events_config": kv_events_config(logs / name)}
        kind = WorkerProcess if args.engine == "mmgate" else UpstreamServicerProcess
        workers.append(kind(model, logs / f"worker-{name}.log", **extra, **events))
    results = {}
    try:
        for worker in workers:
            worker.wait_ready()
        for policy in args.policies.split(","):
            for worker in workers:  # every policy starts from cold caches
                worker.stub().FlushCache(_flush_request())
            gateway = GatewayProcess(
                model, [w.address for w in workers], logs / f"gw-{policy}.log", "--policy", policy
            ).wait_ready()
            try:
                results[policy] = run_workload(
                    gateway.base_url,
                    args.conversations,
                    args.turns,
                    args.image_size,
                    # the same images for every policy (fresh caches make them cold again)
                    args.seed,
                )
                results[policy]["per_worker"] = requests_per_worker(gateway.base_url)
            finally:
                gateway.stop()
    finally:
        for worker in workers:
            worker.stop()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    print(f"commit {commit}, {platform.processor() or platform.machine()}, {os.cpu_count()} cores")
    print(
        f"{args.conversations} chats x {args.turns} turns, {args.image_size}px images, "
        f"block size {args.block_size}, KV events {'off' if args.no_kv_events else 'on'}, "
        f"{args.engine} workers, tiny {args.family}"
    )
    print(f"{'policy':<14}{'follow-up hit rate':>20}{'cached/prompt tokens':>24}{'requests':>12}")
    for policy, r in results.items():
        tokens = f"{r['follow_up_cached_tokens']}/{r['follow_up_prompt_tokens']}"
        split = "+".join(map(str, r["per_worker"]))
        print(f"{policy:<14}{r['follow_up_hit_rate']:>20.3f}{tokens:>24}{split:>12}")
    if {"cache_aware", "round_robin"} <= results.keys() and results["round_robin"][
        "follow_up_hit_rate"
    ]:
        ratio = (
            results["cache_aware"]["follow_up_hit_rate"]
            / results["round_robin"]["follow_up_hit_rate"]
        )
        print(f"cache_aware / round_robin hit rate: {ratio:.2f}x")
    print(f"logs: {logs}")
    return 0


def _flush_request():
    from protos import common_pb2

    return common_pb2.FlushCacheRequest()


if __name__ == "__main__":
    raise SystemExit(main())
