"""The VllmEngine gRPC service over vLLM's AsyncLLM (EngineClient)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import grpc
from vllm import PoolingParams
from vllm.inputs.engine import tokens_input

from engine_server import kv_events, model_info, tracing
from engine_server.errors import CacheMissError, InvalidRequest, status_for
from engine_server.media_refs import FLAG as MM_PROCESSOR_FLAG
from engine_server.media_refs import MediaRefProcessor
from engine_server.mm_inputs import (
    PixelContract,
    build_mm_prompt,
    model_flat_dims,
    wire_modality,
)
from engine_server.mm_item_cache import DEFAULT_ITEM_SENDERS, GIB, ItemCache
from engine_server.mm_slots import EmbeddingSlots
from engine_server.outputs import final_responses, stream_responses
from engine_server.sampling import (
    kv_transfer_params_from_request,
    sampling_params_from_proto,
    truncate_prompt,
)
from engine_server.tokenizer_bundle import TokenizerBundle, chunks
from protos import common_pb2, extensions
from protos import vllm_engine_pb2 as pb
from protos import vllm_engine_pb2_grpc as pb_grpc

log = logging.getLogger("mmgate.engine")

try:
    from vllm.version import __version__ as VLLM_VERSION
except ImportError:  # pragma: no cover
    VLLM_VERSION = ""


class EngineServicer(pb_grpc.VllmEngineServicer):
    def __init__(
        self,
        engine: Any,
        media: MediaRefProcessor | None = None,
        media_source: str = "",
        item_senders: int = DEFAULT_ITEM_SENDERS,
    ) -> None:
        """`media`: worker-side processing of `media_refs` (None: refused), configured from
        `media_source` ("flag", "env" or "default"); `item_senders`: how many gateway
        processes' shares of the item cache it keeps at once (--mm-item-cache-senders)."""
        self.engine = engine
        self.media = media
        self.media_source = media_source if media is not None else ""
        self.model_config = engine.model_config
        self.contract = PixelContract(
            device_normalizes=model_info.device_normalizes(self.model_config),
            model_dtype=self.model_config.dtype,
        )
        self.slots = EmbeddingSlots(engine)
        self.flat_dims = model_flat_dims(getattr(engine.renderer, "mm_processor", None))
        # Send-once (protos/extensions.py, MM_ITEM_CACHE): items kept by hash, bounded by
        # vLLM's --mm-processor-cache-gb, whose budget counts a copy in this (the API) process
        # as vLLM's own cache does; 0 turns it off. Split in equal shares, one per sending
        # gateway process, at most `item_senders` of them. Prompts are built in threads: one
        # lock.
        self.items = item_cache(self.model_config, item_senders)
        self._items_lock = threading.Lock()
        self.start_time = time.time()
        self.last_receive = 0.0
        self.draining = False
        # request id -> whether the engine has produced output for it (running vs waiting)
        self.in_flight: dict[str, bool] = {}
        self.kv_events = kv_events.resolve_config(engine)
        self._bundle = TokenizerBundle(str(self.model_config.tokenizer or self.model_config.model))

    # ---- generation ----

    async def Generate(self, request: pb.GenerateRequest, context) -> AsyncIterator:
        request_id = request.request_id or uuid.uuid4().hex
        self._received(request_id)
        metadata = context.invocation_metadata()
        parent = tracing.incoming(metadata)
        call, failure = tracing.start_call("mmgate.engine.generate", parent), None
        call.set_attribute("request.id", request_id)
        try:
            prepare = tracing.start_child("mmgate.engine.prepare", call)
            try:
                prompt = await self._prompt(request, extensions.item_cache_call(metadata))
            finally:
                tracing.finish(prepare)
            params = sampling_params_from_proto(
                request.sampling_params,
                stream=request.stream,
                kv_transfer_params=kv_transfer_params_from_request(request),
                thinking_token_budget=thinking_budget(metadata),
                allowed_token_ids=allowed_token_ids(metadata),
            )
            want = (params.logprobs, params.prompt_logprobs)
            seen: set[int] = set()
            rank = request.data_parallel_rank if request.HasField("data_parallel_rank") else None
            # The router asks for the grammar from the first token (vLLM's server passes
            # reasoning_ended=True when reasoning is hidden or the prompt closed it); otherwise
            # the engine checks the prompt with its own reasoning parser.
            ended = True if request.sampling_params.grammar_from_first_token else None
            async for output in self.engine.generate(
                prompt,
                params,
                request_id,
                data_parallel_rank=rank,
                reasoning_ended=ended,
                trace_headers=tracing.headers(call),
            ):
                self.in_flight[request_id] = True
                if request.stream:
                    for response in stream_responses(output, seen, want):
                        yield response
                elif output.finished:
                    for response in final_responses(output, want):
                        yield response
        except Exception as error:  # noqa: BLE001 - every failure becomes a status
            failure = error
            await self._fail(context, "Generate", request_id, error)
        finally:
            self.in_flight.pop(request_id, None)
            tracing.finish(call, failure)

    async def _prompt(
        self, request: pb.GenerateRequest, items: extensions.ItemCacheCall | None = None
    ) -> Any:
        """`items`: what the call tells the item cache (None: nothing, every item in full)."""
        batches = [request.mm_inputs] if request.HasField("mm_inputs") else []
        batches += list(request.extra_mm_inputs)
        if request.HasField("media_refs"):
            return await self._media_ref_prompt(request, bool(batches))
        kind = request.WhichOneof("input")
        if kind is None:
            raise InvalidRequest("input: set either tokenized or text")
        if batches and kind != "tokenized":
            raise InvalidRequest("mm_inputs: multimodal requests need tokenized input")
        if batches:
            return await asyncio.to_thread(
                self._mm_prompt, request.tokenized, batches, request, items
            )
        if items is not None and items.cached:
            raise InvalidRequest(f"{extensions.CACHED_ITEMS}: the request has no media items")
        tok_params = self._tok_params(request.sampling_params)
        if kind == "text":
            prompt: dict = {"prompt": request.text}
        else:
            if not request.tokenized.input_ids:
                raise InvalidRequest("tokenized.input_ids: the prompt is empty")
            prompt = {"prompt_token_ids": list(request.tokenized.input_ids)}
            if request.tokenized.original_text:
                prompt["prompt"] = request.tokenized.original_text
        # vLLM's own renderer: the same truncation, vocabulary and context-length checks
        # (and errors) as its OpenAI server applies to a completion prompt.
        (engine_input,) = await self.engine.renderer.render_cmpl_async([prompt], tok_params)
        return engine_input

    async def _media_ref_prompt(self, request: pb.GenerateRequest, preprocessed: bool) -> Any:
        if self.media is None:
            raise InvalidRequest(
                f"media_refs: this worker takes preprocessed mm_inputs only ({MM_PROCESSOR_FLAG} "
                "is off); start it with --mm-processor inprocess to have it process media"
            )
        if request.WhichOneof("input") != "tokenized" or preprocessed:
            raise InvalidRequest(
                "media_refs: needs tokenized input and cannot be combined with mm_inputs"
            )
        ids = list(request.tokenized.input_ids)
        if request.sampling_params.HasField("truncate_prompt_tokens"):
            raise InvalidRequest(
                "sampling_params.truncate_prompt_tokens would cut a multimodal prompt; "
                "shorten the prompt or the media instead"
            )
        self._check_ids(ids)
        return await self.media.process(
            ids, request.tokenized.original_text, request.media_refs, time.time()
        )

    def _tok_params(self, params: pb.SamplingParams) -> Any:
        defaults = self.engine.renderer.default_cmpl_tok_params
        if not params.HasField("truncate_prompt_tokens"):
            return defaults
        return dataclasses.replace(defaults, truncate_prompt_tokens=params.truncate_prompt_tokens)

    def _mm_prompt(
        self,
        tokenized: pb.TokenizedInput,
        batches: list,
        request,
        items: extensions.ItemCacheCall | None = None,
    ) -> Any:
        ids = list(tokenized.input_ids)
        max_len = self.model_config.max_model_len
        if truncate_prompt(ids, request.sampling_params, max_len) != ids:
            raise InvalidRequest(
                "sampling_params.truncate_prompt_tokens would cut a multimodal prompt; "
                "shorten the prompt or the media instead"
            )
        self._check_ids(ids)
        self._check_item_limits(batches)
        cached = self._cached_items(items)
        prompt = build_mm_prompt(
            ids,
            batches,
            self.contract,
            tokenized.original_text,
            self.slots.check,
            self._modality,
            cached,
            self.flat_dims,
        )
        if items is not None and self.items is not None:
            with self._items_lock:
                self.items.update(items, prompt_items(prompt))
        return prompt

    def _cached_items(self, items: extensions.ItemCacheCall | None) -> dict[str, Any]:
        """The items the call left out, from the cache; a miss refuses the whole request
        (FAILED_PRECONDITION naming every missing item) before the cache changes."""
        if items is None or not items.cached:
            return {}
        if self.items is None:
            raise CacheMissError(extensions.CacheMiss("", tuple(dict.fromkeys(items.cached))))
        with self._items_lock:
            return self.items.lookup(items)

    def _check_item_limits(self, batches: list) -> None:
        if not self.model_config.is_multimodal_model:
            raise InvalidRequest("mm_inputs: this model takes no multimodal input")
        counts: dict[str, int] = {}
        for batch in batches:
            modality = self._modality(wire_modality(batch))
            counts[modality] = counts.get(modality, 0) + len(batch.mm_placeholders)
        mm_config = self.model_config.get_multimodal_config()
        model_info.check_item_counts(mm_config, counts, "mm_inputs")

    def _modality(self, wire: str) -> str:
        return model_info.engine_modality(self.model_config, wire)

    def _check_ids(self, ids: list[int]) -> None:
        vocab = self.model_config.get_vocab_size()
        if not ids:
            raise InvalidRequest("tokenized.input_ids: the prompt is empty")
        if max(ids) >= vocab:
            raise InvalidRequest(
                f"tokenized.input_ids: token id {max(ids)} is out of vocabulary (size {vocab})"
            )
        if len(ids) >= self.model_config.max_model_len:
            raise InvalidRequest(
                f"tokenized.input_ids: {len(ids)} prompt tokens leave no room to generate in "
                f"the model's context of {self.model_config.max_model_len}"
            )

    async def Embed(self, request: pb.EmbedRequest, context) -> pb.EmbedResponse:
        request_id = request.request_id or uuid.uuid4().hex
        self._received(request_id)
        try:
            if not request.tokenized.input_ids:
                raise InvalidRequest("tokenized.input_ids: the prompt is empty")
            self._check_ids(list(request.tokenized.input_ids))
            prompt = tokens_input(
                list(request.tokenized.input_ids), prompt=request.tokenized.original_text or None
            )
            final = None
            async for output in self.engine.encode(prompt, PoolingParams(task="embed"), request_id):
                self.in_flight[request_id] = True
                final = output
            if final is None or not final.finished:
                raise RuntimeError("the engine finished without an embedding")
            vector = final.outputs.data.flatten().tolist()
            return pb.EmbedResponse(
                embedding=vector,
                prompt_tokens=len(final.prompt_token_ids),
                embedding_dim=len(vector),
            )
        except Exception as error:  # noqa: BLE001
            await self._fail(context, "Embed", request_id, error)
        finally:
            self.in_flight.pop(request_id, None)

    async def Abort(self, request: pb.AbortRequest, context) -> pb.AbortResponse:
        if request.request_ids:
            await self.engine.abort(list(request.request_ids))
        return pb.AbortResponse()

    # ---- state ----

    async def HealthCheck(self, request, context) -> pb.HealthCheckResponse:
        if self.engine.errored:
            return pb.HealthCheckResponse(healthy=False, message="engine is dead")
        if self.draining:
            return pb.HealthCheckResponse(healthy=False, message="draining")
        return pb.HealthCheckResponse(healthy=True, message="Healthy")

    async def GetModelInfo(self, request, context) -> pb.GetModelInfoResponse:
        return model_info.model_info(self.model_config, self.engine.tokenizer)

    async def GetServerInfo(self, request, context) -> pb.GetServerInfoResponse:
        state = {
            "active_requests": len(self.in_flight),
            "is_paused": await self.engine.is_paused(),
            "last_receive_timestamp": self.last_receive,
            "start_time": self.start_time,
        }
        info = model_info.server_info(self.engine.vllm_config, state)
        if self.media is not None:
            info.mm_processor = self.media.name
            info.mm_media_ref_schemes = self.media.schemes
            info.mm_processor_source = self.media_source
        # mmgate's additions beyond the proto (protos/extensions.py), for our gateway.
        names = model_info.capabilities(self.engine.vllm_config)
        cache = ()
        if self.items is not None:
            names.add(extensions.MM_ITEM_CACHE)
            cache = extensions.item_cache_metadata(self.items.info)
        context.set_trailing_metadata((*extensions.capabilities_metadata(names), *cache))
        return info

    async def GetLoads(self, request, context) -> pb.GetLoadsResponse:
        # The engine's own count of unfinished requests (n>1 samples count apiece), of which
        # those that have not produced output yet are waiting.
        total = self.engine.get_num_unfinished_requests()
        waiting = min(sum(not started for started in self.in_flight.values()), total)
        return model_info.loads(self.engine, total - waiting, waiting, VLLM_VERSION)

    async def GetTokenizer(self, request, context) -> AsyncIterator:
        try:
            data = await self._bundle.data()
        except FileNotFoundError as error:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(error))
        for chunk in chunks(data):
            yield chunk

    async def SubscribeKvEvents(self, request, context) -> AsyncIterator:
        """vLLM's KV cache events (engine_server/kv_events.py), or UNIMPLEMENTED without
        --kv-events-config (subscribers then keep their own guess of the cache)."""
        if self.kv_events is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, kv_events.DISABLED)
        if request.start_sequence_number:
            await context.abort(
                grpc.StatusCode.OUT_OF_RANGE,
                "KV event cursors are per subscription; subscribe with 0 and rebuild",
            )
        config = self.kv_events
        batches = kv_events.relay(
            kv_events.rank_sources(config, self.engine),
            topic=config.topic or "",
            hwm=config.hwm,
            # a drain must not wait for a stream that never ends by itself
            stopped=lambda: self.draining or context.cancelled(),
            ready=lambda: context.send_initial_metadata(()),
        )
        try:
            async for batch in batches:
                yield batch
        except kv_events.RelayFailure as error:
            log.warning("SubscribeKvEvents: %s; the subscriber must resubscribe", error)
            await context.abort(grpc.StatusCode.DATA_LOSS, str(error))

    # ---- admin ----

    async def FlushCache(self, request, context) -> common_pb2.FlushCacheResponse:
        # The item cache too: a sender's mirror then finds out by a miss, and resends.
        if self.items is not None:
            with self._items_lock:
                self.items.clear()
        ok = await self.engine.reset_prefix_cache()
        message = "prefix cache flushed" if ok else "requests are running; cache not flushed"
        return common_pb2.FlushCacheResponse(success=bool(ok), message=message)

    async def StartProfile(self, request, context) -> common_pb2.ProfileResponse:
        return await self._profile(self.engine.start_profile)

    async def StopProfile(self, request, context) -> common_pb2.ProfileResponse:
        return await self._profile(self.engine.stop_profile)

    async def _profile(self, action) -> common_pb2.ProfileResponse:
        try:
            await action()
        except Exception as error:  # noqa: BLE001 - profiler not configured, already running...
            return common_pb2.ProfileResponse(success=False, message=str(error))
        return common_pb2.ProfileResponse(success=True, message="ok")

    # ---- helpers ----

    def _received(self, request_id: str) -> None:
        self.last_receive = time.time()
        self.in_flight[request_id] = False

    async def _fail(self, context, rpc: str, request_id: str, error: Exception) -> None:
        code = status_for(error)
        message = str(error) or type(error).__name__
        if code == grpc.StatusCode.INTERNAL:
            log.exception("%s %s failed", rpc, request_id)
        else:
            log.info("%s %s rejected (%s): %s", rpc, request_id, code.name, message)
        await context.abort(code, message)


def item_cache(model_config: Any, senders: int = DEFAULT_ITEM_SENDERS) -> ItemCache | None:
    """The send-once item cache for a multimodal model, in `senders` shares; None when
    --mm-processor-cache-gb is 0."""
    if not model_config.is_multimodal_model:
        return None
    size = int(model_config.get_multimodal_config().mm_processor_cache_gb * GIB)
    return ItemCache(size, senders=senders) if size >= senders else None


def prompt_items(prompt: Any) -> dict[str, Any]:
    """A built multimodal prompt's items by hash."""
    items = {}
    for modality, hashes in (prompt.get("mm_hashes") or {}).items():
        for key, item in zip(hashes, prompt["mm_kwargs"].get(modality, ())):
            items[key] = item
    return items


def thinking_budget(metadata: Any) -> int | None:
    """The call's thinking budget (protos/extensions.py); a malformed one is the caller's
    fault."""
    try:
        return extensions.thinking_token_budget(metadata)
    except ValueError as error:
        raise InvalidRequest(str(error)) from None


def allowed_token_ids(metadata: Any) -> list[int] | None:
    """The call's allowed token ids (protos/extensions.py); malformed ones are the caller's
    fault (vLLM checks them against the vocabulary)."""
    try:
        return extensions.allowed_token_ids(metadata)
    except ValueError as error:
        raise InvalidRequest(str(error)) from None
