"""A fast VllmEngine worker with no model: a benchmark fixture for the gateways in front of it.

    python -m benchmarks.mock_worker --port 50051 --model DIR [--output-tokens 16]

It answers every RPC a gateway needs (GetModelInfo, GetServerInfo, HealthCheck, GetTokenizer,
GetLoads, Abort, Generate) as `mmgate engine` answers them, read off the model directory's
configs instead of vLLM. Generate streams a fixed number of valid output tokens (a sentence
of the model's vocabulary, repeated) without computing anything, chunked like the real
worker: one chunk per token and then a Complete repeating the last delta (or one Complete
with every token when `stream` is off), `--token-interval` seconds apart when streamed; with
`--stats-file` it keeps counts of calls begun, finished and cancelled. Multimodal inputs are
accepted and ignored (shared memory segments are unlinked, as the real worker does once it
has read them). With `--mm-item-cache-mb N` it advertises an item cache of N MiB (send each
image once, protos/extensions.py) and honours it as `mmgate engine` does: it keeps the
hashes it is told to keep, drops those it is told to drop, and refuses a request leaving out
an item it does not hold (FAILED_PRECONDITION naming them), without keeping any tensor.

The response bytes are serialized once per (prompt length, token count, stream) and cached,
so the worker costs as little CPU per request as grpc.aio allows. Requests whose id contains
`capture-NAME` are written to `--capture-dir/capture-NAME.bin`, so a benchmark can replay
exactly what a gateway sent.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import time
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import grpc

from engine_server.tokenizer_bundle import TokenizerBundle, chunks
from protos import common_pb2, extensions
from protos import vllm_engine_pb2 as pb

SERVICE = "vllm.grpc.engine.VllmEngine"
OUTPUT_TEXT = " the sea is calm and the sky is clear while waves roll over the sand"
MAX_MODEL_LEN = 4096
MAX_NUM_SEQS = 256
CAPTURE_MARK = "capture-"
SERVER_OPTIONS = [
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
    ("grpc.http2.max_ping_strikes", 0),
    ("grpc.keepalive_permit_without_calls", True),
]


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _ids(value: Any) -> list[int]:
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    return [v for v in value or [] if isinstance(v, int)]


def eos_token_ids(config: dict, generation: dict) -> list[int]:
    """The config's EOS, then the generation config's extras (as vLLM stops on them)."""
    text = config.get("text_config", config)
    ids = _ids(config.get("eos_token_id", text.get("eos_token_id")))
    return ids + [i for i in _ids(generation.get("eos_token_id")) if i not in ids]


def model_info(model_dir: Path) -> pb.GetModelInfoResponse:
    config = _read_json(model_dir / "config.json")
    generation = _read_json(model_dir / "generation_config.json")
    text = config.get("text_config", config)
    return pb.GetModelInfoResponse(
        model_path=str(model_dir),
        is_generation=True,
        max_context_length=MAX_MODEL_LEN,
        vocab_size=int(text.get("vocab_size", config.get("vocab_size", 0))),
        supports_vision="vision_config" in config,
        served_model_name=str(model_dir),
        tokenizer_path=str(model_dir),
        model_type=str(config.get("model_type", "")),
        architectures=list(config.get("architectures", [])),
        eos_token_ids=eos_token_ids(config, generation),
        pad_token_id=int(text.get("pad_token_id") or 0),
        bos_token_id=int(text.get("bos_token_id") or 0),
        max_req_input_len=MAX_MODEL_LEN,
    )


def output_token_ids(model_dir: Path, count: int) -> list[int]:
    """`count` ids of a plain sentence in the model's own vocabulary (no special tokens)."""
    from tokenizers import Tokenizer

    sentence = Tokenizer.from_file(str(model_dir / "tokenizer.json")).encode(
        OUTPUT_TEXT, add_special_tokens=False
    )
    return [sentence.ids[i % len(sentence.ids)] for i in range(count)]


def unlink_shm_segments(request: pb.GenerateRequest) -> None:
    batches = [request.mm_inputs] if request.HasField("mm_inputs") else []
    for batch in [*batches, *request.extra_mm_inputs]:
        tensors = [batch.pixel_values, *batch.model_specific_tensors.values()]
        for tensor in tensors:
            if tensor.WhichOneof("payload") == "shm" and "/" not in tensor.shm.name:
                _unlink_quietly(os.path.join("/dev/shm", tensor.shm.name))


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def stream_messages(tokens: list[int], prompt_tokens: int, finish: str) -> list[bytes]:
    """Per-token chunks, then a Complete that repeats the last delta (as vLLM's DELTA mode)."""
    messages = [
        pb.GenerateResponse(
            chunk=pb.GenerateStreamChunk(
                token_ids=[token], prompt_tokens=prompt_tokens, completion_tokens=1
            )
        )
        for token in tokens
    ]
    last = tokens[-1:]
    done = pb.GenerateComplete(
        output_ids=last, finish_reason=finish, prompt_tokens=prompt_tokens, completion_tokens=1
    )
    messages.append(pb.GenerateResponse(complete=done))
    return [m.SerializeToString() for m in messages]


def final_messages(tokens: list[int], prompt_tokens: int, finish: str) -> list[bytes]:
    done = pb.GenerateComplete(
        output_ids=tokens,
        finish_reason=finish,
        prompt_tokens=prompt_tokens,
        completion_tokens=len(tokens),
    )
    return [pb.GenerateResponse(complete=done).SerializeToString()]


class ItemHashes:
    """The item cache's bookkeeping without the items (engine_server/mm_item_cache.py's rules):
    each kept hash with its share of its batch's tensor bytes, bounded by `max_bytes`."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes, self.instance = max_bytes, os.urandom(8).hex()
        self.sizes: dict[str, int] = {}  # insertion order: least recently used first
        self.used = 0

    def info(self) -> extensions.ItemCacheInfo:
        return extensions.ItemCacheInfo(self.max_bytes, self.instance)

    def miss(self, call: extensions.ItemCacheCall) -> extensions.CacheMiss | None:
        missing = [h for h in dict.fromkeys(call.cached) if h not in self.sizes]
        if call.instance != self.instance:
            missing = list(dict.fromkeys(call.cached))
        return extensions.CacheMiss(self.instance, tuple(missing)) if missing else None

    def update(self, call: extensions.ItemCacheCall, request: pb.GenerateRequest) -> None:
        if call.instance != self.instance:
            return
        for key in call.evict:
            self.used -= self.sizes.pop(key, 0)
        sizes = _sent_item_bytes(request, set(call.cached))
        for key in call.store:
            size = sizes.get(key, 0)
            self.used -= self.sizes.pop(key, 0)
            while self.sizes and self.used + size > self.max_bytes:
                self.used -= self.sizes.pop(next(iter(self.sizes)))
            self.sizes[key] = size
            self.used += size


def _sent_item_bytes(request: pb.GenerateRequest, cached: set[str]) -> dict[str, int]:
    sizes = {}
    batches = [request.mm_inputs] if request.HasField("mm_inputs") else []
    for batch in [*batches, *request.extra_mm_inputs]:
        sent = [h for h in batch.mm_hashes if h not in cached]
        tensors = [batch.pixel_values, *batch.model_specific_tensors.values()]
        total = sum(len(t.inline) or t.shm.nbytes for t in tensors)
        for key in sent:
            sizes[key] = total // max(1, len(sent))
    return sizes


def prompt_length(request: pb.GenerateRequest) -> int:
    if request.WhichOneof("input") == "tokenized":
        return len(request.tokenized.input_ids)
    return max(1, len(request.text) // 4)


class MockEngine:
    """The RPC behaviours; `handler()` wires them into a grpc.aio server."""

    def __init__(
        self,
        model_dir: Path,
        output_tokens: int,
        capture_dir: Path | None,
        token_interval: float = 0.0,
        stats_file: Path | None = None,
        item_cache_bytes: int = 0,
    ) -> None:
        """`item_cache_bytes`: the item cache advertised and honoured (0: none)."""
        self.model_dir = model_dir
        self.token_interval = token_interval  # seconds between streamed tokens (0: none)
        self.stats_file = stats_file
        self.started = self.cancelled = 0  # Generate calls begun; ended by the client
        self.info = model_info(model_dir)
        self.tokens = output_token_ids(model_dir, output_tokens)
        self.capture_dir = capture_dir
        self.bundle = TokenizerBundle(str(model_dir))
        self.start_time = time.time()
        self.last_receive = 0.0
        self.active = 0
        self.served = 0
        self._replies: dict[tuple[int, int, bool], list[bytes]] = {}
        self.items = ItemHashes(item_cache_bytes) if item_cache_bytes > 0 else None

    # ---- generation ----

    async def generate(self, request: pb.GenerateRequest, context: Any) -> AsyncIterator[bytes]:
        self.last_receive = time.time()
        self.active += 1
        self.started += 1
        finished = False
        try:
            self._inspect(request)
            call = extensions.item_cache_call(context.invocation_metadata())
            if call is not None:
                miss = self.items.miss(call) if self.items is not None else None
                if self.items is None and call.cached:
                    miss = extensions.CacheMiss("", call.cached)
                if miss is not None:
                    code = grpc.StatusCode.FAILED_PRECONDITION
                    await context.abort(code, extensions.cache_miss_message(miss))
                if self.items is not None:
                    self.items.update(call, request)
            for i, message in enumerate(self._reply(request)):
                if i and self.token_interval and request.stream:
                    await asyncio.sleep(self.token_interval)
                yield message
            self.served += 1
            finished = True
        finally:
            self.active -= 1
            # A call that did not finish was cancelled by its client: the engine's abort.
            self.cancelled += not finished

    def stats(self) -> dict[str, int]:
        """Generate calls: begun, finished, cancelled by the client, still open."""
        return {
            "started": self.started,
            "finished": self.served,
            "cancelled": self.cancelled,
            "active": self.active,
        }

    async def write_stats(self) -> None:
        """`stats()` into --stats-file every 0.1 s (atomically), for a harness to read."""
        while self.stats_file is not None:
            partial = self.stats_file.with_suffix(".tmp")
            partial.write_text(json.dumps(self.stats()))
            partial.replace(self.stats_file)
            await asyncio.sleep(0.1)

    def _inspect(self, request: pb.GenerateRequest) -> None:
        if request.HasField("mm_inputs") or request.extra_mm_inputs:
            unlink_shm_segments(request)
        if self.capture_dir and CAPTURE_MARK in request.request_id:
            name = request.request_id[request.request_id.index(CAPTURE_MARK) :]
            path = self.capture_dir / (name.replace("/", "_") + ".bin")
            path.write_bytes(request.SerializeToString())

    def _reply(self, request: pb.GenerateRequest) -> list[bytes]:
        wanted = request.sampling_params.max_tokens or len(self.tokens)
        count = max(1, min(wanted, len(self.tokens)))
        key = (prompt_length(request), count, request.stream)
        cached = self._replies.get(key)
        if cached is None:
            finish = "length" if count == wanted else "stop"
            build = stream_messages if request.stream else final_messages
            cached = self._replies[key] = build(self.tokens[:count], key[0], finish)
        return cached

    async def abort(self, request: pb.AbortRequest, context: Any) -> pb.AbortResponse:
        return pb.AbortResponse()

    # ---- state ----

    async def health_check(self, request: Any, context: Any) -> pb.HealthCheckResponse:
        return pb.HealthCheckResponse(healthy=True, message="Healthy")

    async def get_model_info(self, request: Any, context: Any) -> pb.GetModelInfoResponse:
        return self.info

    async def get_server_info(self, request: Any, context: Any) -> pb.GetServerInfoResponse:
        vision = self.info.supports_vision
        if self.items is not None and vision:
            context.set_trailing_metadata(
                (
                    *extensions.capabilities_metadata([extensions.MM_ITEM_CACHE]),
                    *extensions.item_cache_metadata(self.items.info()),
                )
            )
        return pb.GetServerInfoResponse(
            active_requests=self.active,
            last_receive_timestamp=self.last_receive,
            uptime_seconds=time.time() - self.start_time,
            server_type="vllm-grpc",
            data_parallel_size=1,
            kv_cache_dtype="auto",
            block_size=16,
            model_dtype="torch.float32",
            mm_device_do_normalize=vision,
            max_num_seqs=MAX_NUM_SEQS,
            mm_item_limits="image=8" if vision else "",
            multimodal_encoder_dtype="float32",
            constrained_decoding_start="first_token",
        )

    async def get_loads(self, request: Any, context: Any) -> pb.GetLoadsResponse:
        load = pb.SchedulerLoad(
            num_running_reqs=self.active,
            num_total_reqs=self.active,
            max_total_num_tokens=MAX_MODEL_LEN * MAX_NUM_SEQS,
            max_running_requests=MAX_NUM_SEQS,
        )
        return pb.GetLoadsResponse(
            timestamp=datetime.now(timezone.utc).isoformat(),
            version="mock",
            dp_rank_count=1,
            loads=[load],
        )

    async def get_tokenizer(self, request: Any, context: Any) -> AsyncIterator[bytes]:
        for chunk in chunks(await self.bundle.data()):
            yield chunk.SerializeToString()

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(SERVICE, self._method_handlers())

    def _method_handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        unary = grpc.unary_unary_rpc_method_handler
        streaming = grpc.unary_stream_rpc_method_handler

        def answer(behaviour: Callable, request_type: Any) -> grpc.RpcMethodHandler:
            return unary(
                behaviour,
                request_deserializer=request_type.FromString,
                response_serializer=_serialize,
            )

        # Streaming replies are yielded already serialized: no serializer.
        return {
            "Generate": streaming(self.generate, pb.GenerateRequest.FromString, None),
            "GetTokenizer": streaming(
                self.get_tokenizer, common_pb2.GetTokenizerRequest.FromString, None
            ),
            "Abort": answer(self.abort, pb.AbortRequest),
            "HealthCheck": answer(self.health_check, pb.HealthCheckRequest),
            "GetModelInfo": answer(self.get_model_info, pb.GetModelInfoRequest),
            "GetServerInfo": answer(self.get_server_info, pb.GetServerInfoRequest),
            "GetLoads": answer(self.get_loads, pb.GetLoadsRequest),
        }


def _serialize(message: Any) -> bytes:
    return message.SerializeToString()


async def serve(engine: MockEngine, host: str, port: int) -> None:
    server = grpc.aio.server(options=SERVER_OPTIONS)
    server.add_generic_rpc_handlers((engine.handler(),))
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot bind {host}:{port}")
    await server.start()
    print(f"mock worker serving {engine.model_dir} on {host}:{bound}", flush=True)
    stats = asyncio.create_task(engine.write_stats())
    await server.wait_for_termination()
    stats.cancel()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.mock_worker", description=__doc__)
    p.add_argument("--model", type=Path, required=True, help="model directory (configs, tokenizer)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=50051)
    p.add_argument("--output-tokens", type=int, default=16, help="tokens per Generate")
    p.add_argument("--capture-dir", type=Path, help="write requests with id capture-* here")
    p.add_argument(
        "--token-interval", type=float, default=0.0, help="seconds between streamed tokens"
    )
    p.add_argument(
        "--stats-file",
        type=Path,
        help="keep Generate counts (started, finished, cancelled, active) in this JSON file",
    )
    p.add_argument(
        "--mm-item-cache-mb",
        type=float,
        default=0.0,
        help="advertise and honour an item cache of this many MiB, as `mmgate engine "
        "--mm-processor-cache-gb` does (send each image once; 0: none, the default)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    engine = MockEngine(
        args.model,
        args.output_tokens,
        args.capture_dir,
        args.token_interval,
        args.stats_file,
        int(args.mm_item_cache_mb * (1 << 20)),
    )
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(engine, args.host, args.port))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
