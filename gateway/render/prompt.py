"""A chat request to what a worker takes: the one path from messages to a prompt.

Chat completions, /tokenize and `mmgate preprocess` all build their prompts here:
1. `render`: the chat template and the tokenizer (`renderer.ChatRenderer`), one placeholder
   per media item;
2. `expand`: the items fetched (http(s) URLs, concurrently), decoded and preprocessed by the
   model's processors in one worker thread (`multimodal.pipeline`), each placeholder expanded
   into the item's tokens, the tensors serialized for the wire;
   or, for media the worker preprocesses (`by_worker`), `refer`: the items fetched and
   checked, sent as `media_refs` beside the unexpanded prompt (`worker_media`).
The two steps are apart so that a caller can pick a worker by the rendered ids (cache-aware
routing) and then preprocess for that worker's pixel encoding.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from gateway.errors import GatewayError
from gateway.observability import tracing
from gateway.observability.metrics import GatewayMetrics
from gateway.render.messages import MediaItem
from gateway.render.renderer import ChatRenderer, RenderedChat
from gateway.render.video_options import (
    UNTRUSTED_MEDIA_IO,
    VideoSampling,
    default_video_concurrency,
    video_sampling,
)
from gateway.render.worker_media import MmProcessing, download_items, media_refs
from gateway.workers.tensor_transport import InlineTail, SendOnceTail, Tail, TensorTransport
from multimodal.media import MediaPolicy, needs_download
from multimodal.media_cache import MediaCache
from multimodal.pipeline import LoadedItem, PixelEncoding, Prepared, decode_items, prepare
from multimodal.registry import ModelProcessors
from multimodal.wire import MODALITIES, Node, Piece, flatten
from protos import vllm_engine_pb2 as pb

MIB = 1 << 20


def image_concurrency() -> int:
    """Requests whose images are decoded and preprocessed at once: half the cores, at least
    one, as for videos. asyncio's default pool ran up to 6 such threads on 2 cores, each
    taking the GIL from the event loop in turn (switch interval: 5 ms), so text requests
    waited behind all of them. With 32 clients sending 1280x960 images, a varied text chat's
    p99 (benchmarks.gateway_bench, "text under image load", 2 cores): 0.5-1.4 s with 6
    threads, 0.10-0.36 s with one per core, 0.05-0.10 s with one (its p50 halved again),
    for as many images per second."""
    return max(1, (os.cpu_count() or 2) // 2)


# gRPC's own ceiling on one message (a signed 32-bit length), which both ends are set to.
GRPC_MAX_MESSAGE_BYTES = (1 << 31) - 1
# vLLM's words: a request may not bring its own template unless the operator trusts requests.
UNTRUSTED_TEMPLATE = (
    "Chat template is passed with request, but --trust-request-chat-template is not set. "
    "Refused request with untrusted chat template."
)


class PromptRequest(Protocol):
    """The request fields that make a prompt (gateway.api.protocol.ChatPromptFields)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    add_generation_prompt: bool
    continue_final_message: bool
    add_special_tokens: bool
    chat_template: str | None
    chat_template_kwargs: dict[str, Any] | None
    mm_processor_kwargs: dict[str, Any] | None
    media_io_kwargs: dict[str, dict[str, Any]] | None


@dataclass
class Prompt:
    ids: list[int]
    text: str
    prepared: Prepared | None = None  # with media items
    # The GenerateRequest fields carrying the items, serialized (pieces viewing the tensors).
    request_fields: list[Piece] = field(default_factory=list)
    # The decoded items, kept only when asked for (`mmgate preprocess` compares them with
    # transformers): a served request lets them go once they are tensors.
    items: list[LoadedItem] = field(default_factory=list)
    # Media the worker preprocesses (then `ids` holds one unexpanded placeholder per item).
    media_refs: pb.MediaRefs | None = None
    # `request_fields` before each tensor's transport is chosen (per worker: TensorTransport).
    request_nodes: list[Node] = field(default_factory=list)

    @property
    def has_media(self) -> bool:
        return self.prepared is not None or self.media_refs is not None

    def mm_spans(self) -> list[tuple[int, int, str]]:
        """Each preprocessed item's placeholder range in `ids` and its hash, for cache-aware
        routing (gateway.workers.routing.MmSpan); none for media the worker preprocesses."""
        parts = self.prepared.parts if self.prepared is not None else []
        return [
            (offset, length, item_hash)
            for part in parts
            for (offset, length), item_hash in zip(part.ranges, part.hashes)
        ]

    def item_counts(self) -> dict[str, int]:
        if self.media_refs is not None:
            names = {number: name for name, number in MODALITIES.items()}
            counts: dict[str, int] = {}
            for ref in self.media_refs.items:
                counts[names[ref.modality]] = counts.get(names[ref.modality], 0) + 1
            return counts
        parts = self.prepared.parts if self.prepared is not None else []
        return {part.modality: len(part.ranges) for part in parts}


class PromptBuilder:
    def __init__(
        self,
        renderer: ChatRenderer,
        processors: ModelProcessors,
        media_policy: MediaPolicy,
        http_client: httpx.AsyncClient | None = None,
        metrics: GatewayMetrics | None = None,
        mm_processing: MmProcessing = "auto",
        max_concurrent_videos: int | None = None,
        max_message_bytes: int = GRPC_MAX_MESSAGE_BYTES,
        trust_request_mm_kwargs: bool = False,
        tensor_transport: TensorTransport | None = None,
        media_cache: MediaCache | None = None,
    ) -> None:
        """`mm_processing`: who preprocesses media: the gateway where it has the model's
        processor and the worker otherwise ("auto"), only the gateway, or only the worker.
        `max_concurrent_videos`: requests with videos preprocessed at once (the others wait):
        a clip is up to `media_policy.max_video_decoded_bytes` of frames, so this bounds the
        memory videos take, and leaves threads and cores to image and text requests.
        `max_message_bytes`: the most a request's serialized tensors may take on the wire
        (inline: a retry may go to a worker that does not share /dev/shm).
        `trust_request_mm_kwargs`: vLLM's flag; without it a request's `media_io_kwargs` is
        refused as vLLM refuses it (they change what loading a video costs).
        `tensor_transport`: inline or through /dev/shm, per worker (None: always inline).
        `media_cache`: preprocessed items by hash (--mm-processor-cache-gb; None: off)."""
        self.renderer = renderer
        self.processors = processors
        self.media_policy = media_policy
        self.http = http_client
        self.metrics = metrics
        self.mm_processing = mm_processing
        self._video_slots = asyncio.Semaphore(max_concurrent_videos or default_video_concurrency())
        self._image_slots = asyncio.Semaphore(image_concurrency())
        self.max_message_bytes = max_message_bytes
        self.trust_request_mm_kwargs = trust_request_mm_kwargs
        self.tensor_transport = tensor_transport
        self.media_cache = media_cache

    def render(self, request: PromptRequest) -> RenderedChat:
        if request.chat_template is not None:
            raise GatewayError(UNTRUSTED_TEMPLATE, 400, "chat_template")
        if getattr(request, "media_io_kwargs", None) and not self.trust_request_mm_kwargs:
            raise GatewayError(UNTRUSTED_MEDIA_IO, 400, "media_io_kwargs")
        # vLLM renders tools even with tool_choice "none" (unless told otherwise).
        return self.renderer.render(
            request.messages,
            add_generation_prompt=request.add_generation_prompt,
            continue_final_message=request.continue_final_message,
            tools=request.tools,
            chat_template_kwargs=request.chat_template_kwargs,
            add_special_tokens=request.add_special_tokens,
        )

    def by_worker(self, rendered: RenderedChat, audio_inputs: bool = True) -> bool:
        """Whether the worker preprocesses the rendered prompt's media (`refer`), rather than
        the gateway (`expand`). `audio_inputs`: whether a worker takes audio preprocessed here
        (mmgate's engine does, SMG's servicer does not); on auto, audio goes to the worker
        when none does, as if the gateway had no processor for it."""
        if not rendered.media or self.mm_processing == "gateway":
            return False
        if self.mm_processing == "worker":
            return True
        here = set(self.processors.by_modality)
        if not audio_inputs:
            here.discard("audio")
        return any(item.modality not in here for item in rendered.media)

    async def refer(self, request: PromptRequest, rendered: RenderedChat) -> Prompt:
        """The unexpanded prompt and its media, checked, for a worker that preprocesses."""
        for field_name, flag in (
            ("mm_processor_kwargs", "--mm-processor-kwargs"),
            ("media_io_kwargs", "--media-io-kwargs"),
        ):
            if getattr(request, field_name, None):
                raise GatewayError(
                    f"{field_name} cannot reach a worker that preprocesses the media itself "
                    f"(the wire has no field for them); set them on the worker ({flag})",
                    400,
                    field_name,
                )
        started = time.perf_counter()
        with tracing.span("mmgate.media.fetch", mmgate_items=len(rendered.media)):
            refs = await media_refs(rendered.media, self.media_policy, self.http)
        self._observe(time.perf_counter() - started, None, len(rendered.media))
        return Prompt(rendered.token_ids, rendered.prompt, media_refs=refs)

    async def build(
        self, request: PromptRequest, pixels: PixelEncoding, keep_items: bool = False
    ) -> Prompt:
        """Rendered, tokenized and (with media items) preprocessed for an engine taking
        `pixels`."""
        return await self.expand(request, pixels, self.render(request), keep_items)

    async def expand(
        self,
        request: PromptRequest,
        pixels: PixelEncoding,
        rendered: RenderedChat,
        keep_items: bool = False,
    ) -> Prompt:
        if not rendered.media:
            return Prompt(rendered.token_ids, rendered.prompt)
        self._check_processed_here(rendered.media)
        sampling = video_sampling(getattr(request, "media_io_kwargs", None))
        started = time.perf_counter()
        downloaded: list[bytes | None] = [None] * len(rendered.media)
        if needs_download([item.url for item in rendered.media]):  # (data: URIs need no task)
            with tracing.span("mmgate.media.fetch", mmgate_items=len(rendered.media)):
                downloaded = await download_items(rendered.media, self.media_policy, self.http)
        fetched = time.perf_counter()
        families = ",".join(p.family for p in self.processors.by_modality.values())
        # Decoding and preprocessing in one worker thread: one hand-off of the GIL-bound glue
        # between them instead of two (measured: 10-20% less gateway CPU per image request at
        # 32 concurrent, benchmarks/RESULTS.md).
        with tracing.span("mmgate.preprocess", mmgate_family=families):
            async with self._slots_for(rendered.media):
                processing = time.perf_counter()
                loaded, prepared, nodes, fields = await asyncio.to_thread(
                    self._decode_and_prepare,
                    rendered.media,
                    downloaded,
                    request.mm_processor_kwargs or {},
                    pixels,
                    rendered.token_ids,
                    sampling,
                    keep_items,
                )
        self._observe(fetched - started, time.perf_counter() - processing, len(rendered.media))
        self._check_message_size(fields)
        kept = loaded if keep_items else []
        return Prompt(
            prepared.prompt_ids, rendered.prompt, prepared, fields, kept, request_nodes=nodes
        )

    def tail(self, prompt: Prompt) -> Tail:
        """What a Generate call for `prompt` sends after the request's own fields, made for
        each worker it tries."""
        if self.tensor_transport is None or not prompt.request_nodes:
            base: Tail = InlineTail(prompt.request_fields)
        else:
            base = self.tensor_transport.tail(prompt.request_nodes, prompt.request_fields)
        if prompt.prepared is None:
            return base
        # For a worker that keeps items (send-once), the items it holds are left out.
        return SendOnceTail(prompt.prepared, base, self.tensor_transport)

    def _check_message_size(self, fields: Sequence[Piece]) -> None:
        size = sum(len(piece) for piece in fields)
        if size > self.max_message_bytes:
            raise GatewayError(
                f"the request's media make {size / MIB:.0f} MiB of tensors, above the "
                f"{self.max_message_bytes / MIB:.0f} MiB a worker message may carry "
                "(--max-mm-message-mib); send fewer, shorter or smaller items",
                400,
                "messages",
            )

    def _slots_for(self, media: Sequence[MediaItem]) -> contextlib.AbstractAsyncContextManager:
        if any(item.modality == "video" for item in media):
            return self._video_slots
        return self._image_slots

    def _check_processed_here(self, media: Sequence[MediaItem]) -> None:
        """Every item has a processor here (the others go to a worker that preprocesses)."""
        for item in media:
            if item.modality in self.processors.by_modality:
                continue
            how = (
                "--mm-processing gateway"
                if self.mm_processing == "gateway"
                else "this route does not send media to a worker"
            )
            raise GatewayError(
                f"{item.part or 'messages'}: the gateway has no {item.modality} processor for "
                f"this model ({how}); a {item.modality} goes to engine workers started with "
                "--mm-processor inprocess (mmgate serve --mm-processing auto or worker)",
                400,
                "messages",
            )

    def _decode_and_prepare(
        self,
        media: Sequence[MediaItem],
        downloaded: Sequence[bytes | None],
        kwargs: Mapping[str, Any],
        pixels: PixelEncoding,
        prompt_ids: Sequence[int],
        sampling: VideoSampling,
        keep_items: bool = False,
    ) -> tuple[list[LoadedItem], Prepared, list[Node], list[Piece]]:
        """Blocking: each modality's items decoded (a video's frames as its family's loader
        picks them) and preprocessed; the groups in the order their modalities first appear.
        With the media cache, items are decoded only if the cache does not hold them; kept
        items (`keep_items`: `mmgate preprocess` compares them with transformers) bypass it."""
        cache = None if keep_items else self.media_cache
        groups, loaded = [], []
        for modality in dict.fromkeys(item.modality for item in media):
            processor = self.processors.get(modality)
            ks = [k for k, item in enumerate(media) if item.modality == modality]
            sources, raw = [media[k].url for k in ks], [downloaded[k] for k in ks]
            settings = processor.resolve(kwargs)
            lazy = cache is not None  # read now, decoded only if the cache does not hold them
            items = decode_items(
                processor, sources, raw, settings, self.media_policy, sampling, lazy
            )
            groups.append((processor, items))
            loaded += items
        prepared = prepare(groups, prompt_ids, kwargs, pixels, sampling, cache)
        nodes = prepared.request_nodes()
        return loaded, prepared, nodes, flatten(nodes)

    def _observe(self, fetch_seconds: float, process_seconds: float | None, items: int) -> None:
        if self.metrics is None:
            return
        self.metrics.preprocess.labels("fetch").observe(fetch_seconds)
        if process_seconds is not None:  # None: the worker preprocesses
            self.metrics.preprocess.labels("process").observe(process_seconds)
        self.metrics.images.inc(items)
