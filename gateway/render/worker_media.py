"""Media the engine worker preprocesses: `GenerateRequest.media_refs`.

For a model the gateway has no processor file for (or with `--mm-processing worker`), the
prompt keeps one unexpanded placeholder per item and the worker runs vLLM's own processor on
the items (`mmgate engine --mm-processor inprocess`, or the upstream servicer's). The gateway
still fetches every item under its own media policy (address checks, byte and pixel limits,
allowed formats, a video's container, an audio clip's header and samples) and forwards the
checked bytes as base64 `data:` URLs: the worker decodes exactly the bytes that were checked,
not a second download that could resolve elsewhere or come back different, and GPU workers
need no route to the internet.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from typing import Literal

import httpx
import pybase64

from gateway.render.messages import MediaItem, Placeholder
from multimodal.audio import checked_audio
from multimodal.errors import MediaError
from multimodal.media import MediaPolicy, checked_sources, download_all, needs_download
from multimodal.placeholders import known_modalities, placeholder_for
from multimodal.video import checked_video
from multimodal.wire import MODALITIES
from protos import vllm_engine_pb2 as pb

MmProcessing = Literal["auto", "gateway", "worker"]
# SMG names the gateway side "router" (`--mm-processing auto|router|worker`).
MM_PROCESSING: tuple[str, ...] = ("auto", "gateway", "worker", "router")


def mm_processing_mode(name: str) -> MmProcessing:
    """A `--mm-processing` value, SMG's "router" read as "gateway"."""
    if name not in MM_PROCESSING:
        raise ValueError(f"--mm-processing must be one of auto|gateway|worker, got {name!r}")
    return "gateway" if name == "router" else name  # type: ignore[return-value]


# The modalities the chat renderer takes parts of (`image_url`, `video_url`, `audio_url` and
# `input_audio`).
RENDERED_MODALITIES: tuple[str, ...] = ("image", "video", "audio")


def fallback_placeholders(
    architectures: Sequence[str], modalities: Sequence[str] = RENDERED_MODALITIES
) -> dict[str, Placeholder]:
    """What vLLM writes into a "string"-format prompt per item of each of `modalities`, for
    media the gateway has no processor for: images always (vLLM writes nothing for an
    architecture it has no text for), videos and audio where vLLM's model class has a
    placeholder for them (its `get_placeholder_str`), the sign that the model takes them."""
    architectures = tuple(architectures)
    known = {"image", *known_modalities(architectures)}
    return {
        modality: functools.partial(placeholder_for, architectures, modality)
        for modality in modalities
        if modality in known
    }


async def media_refs(
    items: Sequence[MediaItem], policy: MediaPolicy, http: httpx.AsyncClient | None
) -> pb.MediaRefs:
    """The items, fetched and checked under `policy` (a video under its video limits, an
    audio clip under its audio limits), as data: URLs in prompt order."""
    downloaded = await download_items(items, policy, http)
    urls = await asyncio.to_thread(_checked_urls, items, downloaded, policy)
    return pb.MediaRefs(
        items=[
            pb.MediaRef(modality=MODALITIES[item.modality], url=url)
            for item, url in zip(items, urls, strict=True)
        ]
    )


async def download_items(
    items: Sequence[MediaItem], policy: MediaPolicy, http: httpx.AsyncClient | None
) -> list[bytes | None]:
    """Each http(s) item's bytes (None for the others), each modality's concurrently, each
    under its modality's byte limit."""
    downloaded: list[bytes | None] = [None] * len(items)
    groups = [
        ([k for k, item in enumerate(items) if item.modality == m], p)
        for m, p in (
            ("image", policy),
            ("video", policy.for_video()),
            ("audio", policy.for_audio()),
        )
    ]
    groups = [(ks, p) for ks, p in groups if needs_download([items[k].url for k in ks])]
    fetched = await asyncio.gather(*(_download_group(ks, items, p, http) for ks, p in groups))
    for (ks, _), results in zip(groups, fetched, strict=True):
        for k, raw in zip(ks, results, strict=True):
            downloaded[k] = raw
    return downloaded


async def _download_group(
    ks: Sequence[int], items: Sequence[MediaItem], policy: MediaPolicy, http
) -> list[bytes | None]:
    try:
        return await download_all([items[k].url for k in ks], policy, http)
    except MediaError as error:
        _name(error, items[ks[error.index]] if error.index is not None else None, error.index)
        raise


def _checked_urls(
    items: Sequence[MediaItem], downloaded: Sequence[bytes | None], policy: MediaPolicy
) -> list[str]:
    """Blocking: each item's data: URL, checked (images by their header, videos by
    `multimodal.video`, audio by `multimodal.audio`); a failure names the item by its
    modality and index in it."""
    urls, seen = [], {modality: 0 for modality in RENDERED_MODALITIES}
    for item, raw in zip(items, downloaded, strict=True):
        index = seen.get(item.modality, 0)
        seen[item.modality] = index + 1
        try:
            urls.append(_checked_url(item, raw, policy))
        except MediaError as error:
            _name(error, item, index)
            raise
    return urls


def _checked_url(item: MediaItem, raw: bytes | None, policy: MediaPolicy) -> str:
    if item.modality == "video":
        return checked_video(item.url, raw, policy)
    if item.modality == "audio":
        return checked_audio(item.url, raw, policy)
    [(data, mime)] = checked_sources([item.url], [raw], policy)
    return f"data:{mime};base64,{pybase64.b64encode(data).decode('ascii')}"


def _name(error: MediaError, item: MediaItem | None, index: int | None) -> None:
    """Name the item in the error: "video 0: ..." (its index among its modality's)."""
    if item is None:
        return
    error.kind = item.modality
    error.index = index
