"""`mmgate demo`: the whole path on a tiny local vision model, no downloads, no GPU.

An engine worker (vLLM on the CPU behind the VllmEngine gRPC server) and the gateway in front
of it run in this process; one image+text chat request goes through the gateway over HTTP,
and the command prints the answer and a request to try by hand.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import sys

import httpx

QUESTION = "What is in this picture?"
SERVED_NAME = "tiny-qwen2-vl"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mmgate demo",
        description="Build a tiny random-weight Qwen2-VL model locally (no downloads), serve it "
        "with an engine worker and the gateway in front, and send one image+text chat request "
        "through the gateway with the openai wire format.",
    )
    parser.add_argument("--port", type=int, default=8000, help="gateway HTTP port (0: any free)")
    parser.add_argument("--worker-port", type=int, default=0, help="worker gRPC port (0: any)")
    parser.add_argument("--max-tokens", type=int, default=12, help="tokens to generate")
    parser.add_argument(
        "--serve", action="store_true", help="keep both serving after the demo (Ctrl-C stops)"
    )
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    # Small and quick on a CPU: one process, no compilation, 1 GiB of KV cache.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    return asyncio.run(_demo(args))


def _say(message: str) -> None:
    print(f"[demo] {message}", file=sys.stderr, flush=True)


async def _demo(args: argparse.Namespace) -> int:
    from engine_server.tiny_models import ensure_model

    _say("building (or reusing) the tiny vision model ...")
    model = ensure_model("vision")
    _say("starting the engine worker (vLLM on the CPU, ~20 s) ...")
    engine, worker = await _start_worker(model, args.worker_port)
    try:
        worker_port = await worker.start()
        _say(f"engine worker on grpc://127.0.0.1:{worker_port}; starting the gateway ...")
        gateway, serving = await _start_gateway(model, worker_port, args.port)
        base = f"http://127.0.0.1:{gateway.servers[0].sockets[0].getsockname()[1]}"
        try:
            await _ask(base, args.max_tokens)
            if args.serve:
                print(f"\nplayground:    {base}/  (open it in a browser: chat, images included)")
                sys.stdout.flush()
                _say(f"serving on {base}; Ctrl-C to stop")
                await serving
        finally:
            gateway.should_exit = True
            await serving
            await worker.stop()
    finally:
        engine.shutdown()
        # Done once: AsyncLLM.__del__ would shut down again at interpreter exit, when the
        # module globals it uses are already gone, and print a traceback.
        engine.shutdown = lambda timeout=None: None
    return 0


async def _start_worker(model, port: int):
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from engine_server.reaper import start_reaper
    from engine_server.server import EngineServer, ServeOptions

    start_reaper()  # as `mmgate engine` does: its engine core never outlives the demo
    engine_args = AsyncEngineArgs(
        model=str(model),
        max_model_len=2048,
        enforce_eager=True,
        distributed_executor_backend="uni",
        limit_mm_per_prompt={"image": 2, "video": 0},
    )
    engine = AsyncLLM.from_engine_args(engine_args)
    return engine, EngineServer(engine, ServeOptions(port=port))


async def _start_gateway(model, worker_port: int, port: int):
    import uvicorn

    from gateway.server.app import create_app
    from gateway.server.config import GatewayConfig

    config = GatewayConfig(
        model=model, workers=[f"grpc://127.0.0.1:{worker_port}"], served_model_name=SERVED_NAME
    )
    server = uvicorn.Server(
        uvicorn.Config(create_app(config), host="127.0.0.1", port=port, log_level="warning")
    )
    serving = asyncio.create_task(server.serve())
    while not server.started:
        if serving.done():
            await serving
            raise SystemExit(f"the gateway did not start (is port {port} free? try --port 0)")
        await asyncio.sleep(0.05)
    return server, serving


async def _ask(base: str, max_tokens: int) -> None:
    body = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": _demo_image()}},
                    {"type": "text", "text": QUESTION},
                ],
            }
        ],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    async with httpx.AsyncClient(timeout=120) as client:
        model_id = (await client.get(f"{base}/v1/models")).json()["data"][0]["id"]
        reply = await client.post(f"{base}/v1/chat/completions", json={"model": model_id, **body})
    reply.raise_for_status()
    answer = reply.json()
    print(f"gateway:       {base}  (model {model_id})")
    print(f"request:       a 96x64 PNG (data URI) + {QUESTION!r}")
    print(f"prompt tokens: {answer['usage']['prompt_tokens']} (image placeholders expanded)")
    print(f"answer:        {answer['choices'][0]['message']['content']!r}")
    print(f"finish reason: {answer['choices'][0]['finish_reason']}")
    print("(random weights: the text is noise; the gateway, the wire and vLLM are real)")
    print("\nTry it yourself (run `mmgate demo --serve` to keep both running):")
    print(_curl(base, model_id))


def _demo_image() -> str:
    import numpy as np
    from PIL import Image

    y, x = np.mgrid[0:64, 0:96]
    pixels = np.stack([x * 2.6, y * 4, (x + y) * 1.6], axis=-1).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _curl(base: str, model_id: str) -> str:
    body = {
        "model": model_id,
        "messages": [{"role": "user", "content": "Hello!"}],
        "max_tokens": 16,
    }
    return (
        f"  curl {base}/v1/chat/completions -H 'Content-Type: application/json' \\\n"
        f"    -d '{json.dumps(body)}'"
    )
