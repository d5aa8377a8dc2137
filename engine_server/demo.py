"""`mmgate demo`: a worker on a tiny locally built model, answering one Generate over gRPC."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

import grpc

from protos import vllm_engine_pb2 as pb
from protos import vllm_engine_pb2_grpc as pb_grpc

DEFAULT_PROMPT = "def fibonacci(n):"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mmgate demo",
        description="Build a tiny random-weight model locally (no downloads), serve it over "
        "the VllmEngine gRPC protocol and send it one Generate request.",
    )
    parser.add_argument(
        "--prompt", default=DEFAULT_PROMPT, help="text prompt (default: %(default)r)"
    )
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens to generate")
    parser.add_argument("--port", type=int, default=0, help="gRPC port (default: any free port)")
    parser.add_argument(
        "--serve", action="store_true", help="keep serving after the demo request (Ctrl-C stops)"
    )
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    # Small and quick on a CPU: one process, no compilation, 1 GiB of KV cache.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    return asyncio.run(_demo(args))


async def _demo(args: argparse.Namespace) -> int:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from engine_server.server import EngineServer, ServeOptions
    from engine_server.tiny_models import ensure_model

    print("building (or reusing) the tiny demo model...", file=sys.stderr)
    model = str(ensure_model("text"))
    engine_args = AsyncEngineArgs(
        model=model, max_model_len=1024, enforce_eager=True, distributed_executor_backend="uni"
    )
    engine = AsyncLLM.from_engine_args(engine_args)
    server = EngineServer(engine, ServeOptions(port=args.port))
    try:
        port = await server.start()
        await _ask(port, args.prompt, args.max_tokens)
        if args.serve:
            print(f"serving on 127.0.0.1:{port}; Ctrl-C to stop", file=sys.stderr)
            await server.wait_closed()
        else:
            await server.stop()
    finally:
        engine.shutdown()
    return 0


async def _ask(port: int, prompt: str, max_tokens: int) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.VllmEngineStub(channel)
        info = await stub.GetModelInfo(pb.GetModelInfoRequest())
        request = pb.GenerateRequest(
            request_id="demo-1",
            text=prompt,
            sampling_params=pb.SamplingParams(temperature=0.0, max_tokens=max_tokens),
        )
        async for response in stub.Generate(request):
            done = response.complete
        from transformers import AutoTokenizer

        text = AutoTokenizer.from_pretrained(info.tokenizer_path).decode(done.output_ids)
    print(f"model:         {info.model_path} ({info.model_type}, vocab {info.vocab_size})")
    print(f"prompt:        {prompt!r} ({done.prompt_tokens} tokens)")
    print(f"output ids:    {list(done.output_ids)}")
    print(f"output text:   {text!r}")
    print(f"finish reason: {done.finish_reason}")
    print("(random weights: the text is noise; the wire and the engine are real)")
