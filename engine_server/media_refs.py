"""Worker-side media processing: `GenerateRequest.media_refs` through vLLM's own processor.

The fallback for models the router (mmgate's gateway, SMG) has no preprocessing for: the
request carries the prompt's token ids with one *unexpanded* placeholder per item and the
items' URLs in prompt order; this worker fetches them and runs the engine's multimodal
processor, exactly as `vllm serve` would for the same token ids. Off unless asked for with
the upstream servicer's flag (`--mm-processor inprocess`, env `SMG_VLLM_MM_PROCESSOR`), so
a worker that was not told to fetch media never does.

Fetching uses vLLM's MediaConnector built the way its OpenAI server builds it, so the
engine arguments `--allowed-media-domains`, `--allowed-local-media-path` and
`--media-io-kwargs` apply here as they do there.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from engine_server.errors import InvalidRequest, MediaUnavailable
from engine_server.model_info import check_item_counts, engine_modality
from protos import common_pb2

log = logging.getLogger("mmgate.engine")

FLAG = "--mm-processor"
ENV = "SMG_VLLM_MM_PROCESSOR"
ITEM_BYTES_FLAG = "--mm-max-item-bytes"
ITEM_BYTES_ENV = "SMG_VLLM_MM_MAX_ITEM_BYTES"
MODES = ("off", "inprocess")
DEFAULT_MAX_ITEM_BYTES = 32 * 1024 * 1024
_MODALITIES = {
    common_pb2.IMAGE: "image",
    common_pb2.VIDEO: "video",
    common_pb2.AUDIO: "audio",
}


@dataclass(frozen=True)
class MediaRefSettings:
    """`--mm-processor` and its limits, with where the mode came from (reported to routers
    as `GetServerInfo.mm_processor_source`)."""

    mode: str = "off"
    source: str = "default"
    max_item_bytes: int = DEFAULT_MAX_ITEM_BYTES

    @classmethod
    def resolve(
        cls,
        mode: str | None,
        max_item_bytes: int | None = None,
        env: Mapping[str, str] = os.environ,
    ) -> MediaRefSettings:
        """Flag, else environment variable, else off (the upstream servicer's order)."""
        source = "flag" if mode is not None else "env" if env.get(ENV, "").strip() else "default"
        chosen = (mode if mode is not None else env.get(ENV, "") or "off").strip().lower()
        if chosen not in MODES:
            raise ValueError(f"{FLAG} / {ENV}={chosen!r} is not one of {'|'.join(MODES)}")
        limit = max_item_bytes
        if limit is None:
            raw = env.get(ITEM_BYTES_ENV, "").strip()
            if raw and not raw.isdigit():
                raise ValueError(f"{ITEM_BYTES_ENV}={raw!r} is not a number of bytes")
            limit = int(raw) if raw else DEFAULT_MAX_ITEM_BYTES
        if limit <= 0:
            raise ValueError(f"{ITEM_BYTES_FLAG} / {ITEM_BYTES_ENV} must be positive")
        return cls(chosen, source, limit)


@dataclass(frozen=True)
class MediaRef:
    modality: str
    url: str


def parse_media_refs(refs: Any, accepted_schemes: frozenset[str]) -> list[MediaRef]:
    """The request's references in prompt order, each with a modality and a scheme this
    worker fetches."""
    items = []
    for index, ref in enumerate(refs.items):
        modality = _MODALITIES.get(ref.modality)
        if modality is None:
            name = common_pb2.Modality.Name(ref.modality)
            raise InvalidRequest(f"media_refs[{index}]: unsupported modality {name}")
        if not ref.url:
            raise InvalidRequest(f"media_refs[{index}].url is empty")
        scheme = urlsplit(ref.url).scheme.lower()
        if scheme not in accepted_schemes:
            raise InvalidRequest(
                f"media_refs[{index}]: url scheme {scheme or 'none'!r} is not accepted by this "
                f"worker (accepted: {','.join(sorted(accepted_schemes))}); file:// needs "
                "--allowed-local-media-path"
            )
        items.append(MediaRef(modality, ref.url))
    if not items:
        raise InvalidRequest("media_refs is set but carries no items")
    return items


def inline_size(url: str) -> int | None:
    """The decoded size of a data: URL's payload (None for other URLs)."""
    if url[:5].lower() != "data:":
        return None
    header, _, payload = url.partition(",")
    return len(payload) * 3 // 4 if ";base64" in header.lower() else len(payload)


class MediaRefProcessor:
    """Fetches a request's media with vLLM's MediaConnector and processes the prompt with
    the engine's own renderer."""

    name = "inprocess"

    def __init__(self, engine: Any, settings: MediaRefSettings) -> None:
        from vllm import envs
        from vllm.multimodal.media.connector import MEDIA_CONNECTOR_REGISTRY
        from vllm.transformers_utils.processor import get_video_processor_cls_name

        model_config = engine.model_config
        mm_config = model_config.get_multimodal_config()
        self._engine = engine
        self._model_config = model_config
        self._mm_config = mm_config
        self._max_item_bytes = settings.max_item_bytes
        self._connector = MEDIA_CONNECTOR_REGISTRY.load(
            envs.VLLM_MEDIA_CONNECTOR,
            media_io_kwargs=mm_config.media_io_kwargs,
            allowed_local_media_path=model_config.allowed_local_media_path,
            allowed_media_domains=model_config.allowed_media_domains,
        )
        self._video_processor = get_video_processor_cls_name(model_config)
        schemes = ["http", "https", "data"]
        if model_config.allowed_local_media_path:
            schemes.append("file")
        self.schemes = ",".join(schemes)
        self.accepted_schemes = frozenset(schemes)
        if not model_config.allowed_media_domains:
            log.warning(
                "%s inprocess without --allowed-media-domains: this worker fetches http(s) "
                "media from any host a router forwards",
                FLAG,
            )

    async def process(
        self, ids: Sequence[int], text: str, refs: Any, arrival_time: float
    ) -> dict[str, Any]:
        """The engine input for `ids` (one unexpanded placeholder per item) and the items."""
        items = parse_media_refs(refs, self.accepted_schemes)
        self._check_items(items)
        media = await asyncio.gather(*(self._fetch(i, item) for i, item in enumerate(items)))
        data: dict[str, list[Any]] = {}
        for item, loaded in zip(items, media):
            modality = engine_modality(self._model_config, item.modality)
            if modality == "vision_chunk":
                # As vLLM's chat parser hands a unified-vision-chunk model (Kimi-K2.5) an image.
                loaded = {"type": "image", "image": loaded, "uuid": None}
            data.setdefault(modality, []).append(loaded)
        prompt: dict[str, Any] = {"prompt_token_ids": list(ids), "multi_modal_data": data}
        if text:
            prompt["prompt"] = text
        if self._model_config.is_encoder_decoder:
            # Whisper-style: the media feed the encoder and `ids` are the decoder's prompt, as
            # vLLM's speech-to-text server builds it (an encoder prompt of no text, whose
            # placeholders the model's processor makes); the renderer then prepends the
            # decoder start token where the ids lack it, as there.
            encoder = {"prompt_token_ids": [], "multi_modal_data": prompt.pop("multi_modal_data")}
            prompt = {"encoder_prompt": encoder, "decoder_prompt": prompt}
        # skip_mm_cache: the bypass path sends items the renderer's sender-side cache never
        # saw, so that cache must not be trusted to mirror the engine core's.
        try:
            return await self._engine.renderer.process_for_engine_async(
                prompt, arrival_time=arrival_time, skip_mm_cache=True
            )
        except (RuntimeError, AssertionError) as error:
            # vLLM checks the placeholders against the items with both (e.g. "Failed to apply
            # prompt replacement"): more items than placeholders is the caller's mistake.
            raise InvalidRequest(f"media_refs: {error}") from error

    def _check_items(self, items: Sequence[MediaRef]) -> None:
        counts: dict[str, int] = {}
        for index, item in enumerate(items):
            modality = engine_modality(self._model_config, item.modality)
            if modality == "vision_chunk" and item.modality != "image":
                # vLLM cuts a video into chunks with its own prompts in the chat parser.
                raise InvalidRequest(
                    f"media_refs[{index}]: this model takes {item.modality} only through "
                    "vLLM's chat parser (vision chunks); send images"
                )
            counts[modality] = counts.get(modality, 0) + 1
            size = inline_size(item.url)
            if size is not None and size > self._max_item_bytes:
                raise InvalidRequest(
                    f"media_refs[{index}]: the inline item is {size} bytes, above this "
                    f"worker's {ITEM_BYTES_FLAG} of {self._max_item_bytes}"
                )
        check_item_counts(self._mm_config, counts, "media_refs")

    async def _fetch(self, index: int, item: MediaRef) -> Any:
        from vllm.exceptions import VLLMClientError

        connector = self._connector
        try:
            if item.modality == "image":
                return await connector.fetch_image_async(item.url)
            if item.modality == "audio":
                return await connector.fetch_audio_async(item.url)
            return await connector.fetch_video_async(
                item.url, video_processor=self._video_processor
            )
        except (VLLMClientError, ValueError) as error:  # the URL or the media is bad
            raise InvalidRequest(f"media_refs[{index}]: {error}") from error
        except Exception as error:  # noqa: BLE001 - a timeout or a refused connection
            raise MediaUnavailable(f"media_refs[{index}]: fetch failed: {error}") from error


def build_media_processor(engine: Any, settings: MediaRefSettings) -> MediaRefProcessor | None:
    if settings.mode == "off":
        return None
    if not engine.model_config.is_multimodal_model:
        log.warning("%s %s ignored: the served model takes no media", FLAG, settings.mode)
        return None
    return MediaRefProcessor(engine, settings)
