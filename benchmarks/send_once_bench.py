"""What a worker spends receiving a request's images, sent in full or left out (send-once).

    python -m benchmarks.send_once_bench [--requests 20]

A 640x480 and a 1280x960 image, preprocessed by the gateway's Qwen2-VL processor into float32
with Qwen2-VL's own max_pixels (12845056, as mm_processor_kwargs: the tiny test model's config
caps images far lower) -- 37 MB of tensors for the pair -- go to a gRPC server
in a child process that does what `mmgate engine`'s Generate does before its engine sees
the request: grpc.aio receives and parses the message, and `build_mm_prompt` (in a worker
thread, as the servicer runs it) turns the tensors into vLLM's items, or, for a request
leaving them out, takes them from the item cache. The child's own CPU time (all its threads,
grpc's included) is read before and after each phase. vLLM's engine is not in the loop: what
it costs (the same either way) is not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import multiprocessing
import resource
import sys
from typing import Any

SERVICE = "vllm.grpc.engine.VllmEngine"
QWEN2_VL_MAX_PIXELS = 12845056  # Qwen2-VL's preprocessor_config.json


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _serve(port_queue: Any) -> None:
    import grpc
    import torch

    from engine_server.errors import CacheMissError
    from engine_server.mm_inputs import PixelContract, build_mm_prompt
    from engine_server.mm_item_cache import ItemCache
    from engine_server.servicer import prompt_items
    from protos import extensions
    from protos import vllm_engine_pb2 as pb

    contract = PixelContract(device_normalizes=False, model_dtype=torch.float32)
    cache = ItemCache(4 << 30)

    def prompt(request: Any, call: Any) -> Any:
        cached = cache.lookup(call) if call is not None else {}
        batches = [request.mm_inputs, *request.extra_mm_inputs]
        built = build_mm_prompt(list(request.tokenized.input_ids), batches, contract, cached=cached)
        if call is not None:
            cache.update(call, prompt_items(built))
        return built

    async def generate(request: Any, context: Any):
        call = extensions.item_cache_call(context.invocation_metadata())
        try:
            await asyncio.to_thread(prompt, request, call)
        except CacheMissError as error:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(error))
        yield pb.GenerateResponse(complete=pb.GenerateComplete(finish_reason="stop"))

    async def cpu(request: Any, context: Any) -> Any:
        return pb.HealthCheckResponse(message=repr(_cpu()))

    async def main() -> None:
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", -1)])
        handlers = {
            "Generate": grpc.unary_stream_rpc_method_handler(
                generate, pb.GenerateRequest.FromString, pb.GenerateResponse.SerializeToString
            ),
            "HealthCheck": grpc.unary_unary_rpc_method_handler(
                cpu, pb.HealthCheckRequest.FromString, pb.HealthCheckResponse.SerializeToString
            ),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        port_queue.put(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        await server.wait_for_termination()

    asyncio.run(main())


def _image(width: int, height: int, seed: int) -> str:
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode()


def _prepared() -> Any:
    from engine_server.tiny_models import ensure_model
    from gateway.render.model_files import ModelFiles
    from gateway.render.renderer import ChatRenderer
    from multimodal.media import MediaPolicy
    from multimodal.pipeline import PixelEncoding, decode_items, prepare
    from multimodal.registry import processors_for

    files = ModelFiles.load(ensure_model("vision"))
    processors = processors_for(files)
    uris = [_image(640, 480, 1), _image(1280, 960, 2)]
    content = [{"type": "image_url", "image_url": {"url": u}} for u in uris]
    messages = [{"role": "user", "content": [*content, {"type": "text", "text": "Describe."}]}]
    rendered = ChatRenderer(files, processors.placeholders).render(messages)
    processor = processors.get("image")
    kwargs = {"max_pixels": QWEN2_VL_MAX_PIXELS}
    settings = processor.resolve(kwargs)
    items = decode_items(processor, uris, [None, None], settings, MediaPolicy())
    encoding = PixelEncoding(raw=False, float_dtype="float32")
    return prepare([(processor, items)], rendered.token_ids, kwargs, encoding)


async def _measure(port: int, requests: int) -> dict[str, float]:
    import grpc

    from gateway.workers.send_once import ItemMirror, item_sizes, plan_nodes
    from multimodal.wire import flatten
    from protos import extensions
    from protos import vllm_engine_pb2 as pb

    prepared = _prepared()
    head = pb.GenerateRequest(tokenized=pb.TokenizedInput(input_ids=prepared.prompt_ids))
    full = b"".join([head.SerializeToString(), *flatten(prepared.request_nodes())])
    mirror = ItemMirror(4 << 30, "")
    pairs = [
        (k, s) for p, ss in zip(prepared.parts, item_sizes(prepared)) for k, s in zip(p.hashes, ss)
    ]
    async with grpc.aio.insecure_channel(
        f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", -1)]
    ) as channel:
        generate = channel.unary_stream(f"/{SERVICE}/Generate")
        health = channel.unary_unary(
            f"/{SERVICE}/HealthCheck", response_deserializer=pb.HealthCheckResponse.FromString
        )

        async def cpu() -> float:
            return float((await health(pb.HealthCheckRequest().SerializeToString())).message)

        async def send(body: bytes, metadata: tuple = ()) -> None:
            async for _ in generate(body, metadata=metadata or None):
                pass

        instance = ""  # learnt from the first miss: the child's cache life
        for _ in range(2):  # warm-up: imports, allocator
            await send(full)
        start = await cpu()
        for _ in range(requests):
            await send(full)
        per_full = (await cpu() - start) / requests
        try:
            await send(
                full, extensions.item_cache_call_metadata(extensions.ItemCacheCall("?", ("x",)))
            )
        except grpc.aio.AioRpcError as error:
            instance = extensions.cache_miss(error.details()).instance
        mirror = ItemMirror(4 << 30, instance)
        store = mirror.plan(pairs)
        await send(full, extensions.item_cache_call_metadata(store.call))
        store.confirm()
        plan = mirror.plan(pairs)
        left_out = b"".join([head.SerializeToString(), *flatten(plan_nodes(prepared, plan.cached))])
        metadata = extensions.item_cache_call_metadata(plan.call)
        await send(left_out, metadata)
        start = await cpu()
        for _ in range(requests):
            await send(left_out, metadata)
        per_cached = (await cpu() - start) / requests
    return {
        "full_bytes": len(full),
        "left_out_bytes": len(left_out),
        "full_ms": per_full * 1e3,
        "cached_ms": per_cached * 1e3,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.send_once_bench")
    parser.add_argument("--requests", type=int, default=20)
    args = parser.parse_args(argv)
    context = multiprocessing.get_context("spawn")
    ports = context.Queue()
    child = context.Process(target=_serve, args=(ports,), daemon=True)
    child.start()
    try:
        result = asyncio.run(_measure(ports.get(timeout=120), args.requests))
    finally:
        child.terminate()
    print(
        f"request bytes: {result['full_bytes'] / 1e6:.1f} MB in full, "
        f"{result['left_out_bytes'] / 1e3:.1f} kB with both images left out\n"
        f"worker CPU per request: {result['full_ms']:.1f} ms in full, "
        f"{result['cached_ms']:.1f} ms left out "
        f"(saved {result['full_ms'] - result['cached_ms']:.1f} ms)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
