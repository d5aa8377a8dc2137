"""Does a video stall text requests? A text chat's latency alone and while clips are processed,
through mmgate and through vLLM's own server, on the same tiny engine.

    python -m benchmarks.video_stall_bench [--seconds S] [--video-clients N]

Starts vLLM's OpenAI server (`vllm serve`) and `mmgate serve` -> `mmgate engine` on the tiny
Qwen2-VL (its video processor's small pixel limit keeps the engine's share small: the clip's
decode, 10 s of 1280x720 at 30 fps, is most of a video request's work). For each target, one
client sends greedy 4-token text chats back to back for `--seconds`, first alone, then while
`--video-clients` clients send 1-token chats with the clip back to back. The text latencies'
median and p99 show whether preprocessing a clip holds up the server's event loop (a stalled
loop adds up to a whole clip's processing to a text request). Both servers get the same
machine (2 cores here: the clips' decode competes for them either way).
"""

from __future__ import annotations

import argparse
import base64
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx

from benchmarks.video_bench import make_clip

TEXT = [{"role": "user", "content": "Say something about the sea."}]


def chat(base: str, model: str, messages: list, max_tokens: int) -> float:
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    start = time.perf_counter()
    reply = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=300)
    reply.raise_for_status()
    return time.perf_counter() - start


def text_latencies(base: str, model: str, seconds: float) -> list[float]:
    out, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        out.append(chat(base, model, TEXT, 4))
    return out


def with_videos(base: str, model: str, uri: str, clients: int, seconds: float):
    stop, done = threading.Event(), []
    content = [{"type": "video_url", "video_url": {"url": uri}}, {"type": "text", "text": "Hi"}]
    video = [{"role": "user", "content": content}]

    def loop() -> None:
        while not stop.is_set():
            done.append(chat(base, model, video, 1))

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)  # the clips in flight before measuring
    try:
        return text_latencies(base, model, seconds), done
    finally:
        stop.set()
        for thread in threads:
            thread.join()


def describe(latencies: list[float]) -> str:
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return f"{len(ordered)} | {statistics.median(ordered) * 1000:.0f} | {p99 * 1000:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--video-clients", type=int, default=2)
    parser.add_argument(
        "--gateway-args",
        default="",
        help="more `mmgate serve` flags, e.g. '--max-concurrent-videos 1'",
    )
    args = parser.parse_args()
    from engine_server.tiny_models import default_cache_root, ensure_model
    from tests.support.engines import VllmServerProcess, WorkerProcess
    from tests.support.gateway_process import GatewayProcess

    model = ensure_model("vision", default_cache_root())
    root = Path(tempfile.mkdtemp(prefix="video-stall-"))
    clip = make_clip(root / "clip.mp4", 10, (1280, 720))
    uri = "data:video/mp4;base64," + base64.b64encode(clip).decode()
    limits = {"limit_mm_per_prompt": {"image": 1, "video": 1}}
    vllm = VllmServerProcess(model, root / "vllm.log", **limits)
    worker = WorkerProcess(model, root / "worker.log", **limits)
    targets = {}
    try:
        vllm.wait_ready()
        worker.wait_ready()
        extra = args.gateway_args.split()
        gateway = GatewayProcess(model, [worker.address], root / "gateway.log", *extra)
        gateway.wait_ready()
        targets = {"mmgate": (gateway.base_url, str(model)), "vLLM": (vllm.base_url, "tiny")}
        if extra:
            print(f"mmgate serve {' '.join(extra)}")
        print("| target | load | text requests | median ms | p99 ms | videos done |")
        print("| --- | --- | --- | --- | --- | --- |")
        for name, (base, served) in targets.items():
            chat(base, served, TEXT, 4)  # warm-up
            alone = text_latencies(base, served, args.seconds)
            print(f"| {name} | text alone | {describe(alone)} | 0 |", flush=True)
            loaded, videos = with_videos(base, served, uri, args.video_clients, args.seconds)
            load = f"with {args.video_clients} video clients"
            print(f"| {name} | {load} | {describe(loaded)} | {len(videos)} |", flush=True)
    finally:
        if targets:
            gateway.stop()
        worker.stop()
        vllm.stop()


if __name__ == "__main__":
    main()
