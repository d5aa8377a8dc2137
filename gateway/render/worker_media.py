"""Media the engine worker preprocesses: `GenerateRequest.media_refs`.

For a model the gateway has no processor file for (or with `--mm-processing worker`), the
prompt keeps one unexpanded placeholder per item and the worker runs vLLM's own processor on
the items (`mmgate engine --mm-processor inprocess`, or the upstream servicer's). The gateway
still fetches every item under its own media policy (address checks, byte and pixel limits,
allowed formats) and forwards the checked bytes as base64 `data:` URLs: the worker decodes
exactly the bytes that were checked, not a second download that could resolve elsewhere or
come back different, and GPU workers need no route to the internet.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from typing import Literal

import httpx
import pybase64

from gateway.render.messages import MediaItem, Placeholder
from multimodal.media import MediaPolicy, checked_sources, download_all, needs_download
from multimodal.placeholders import placeholder_for
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


def fallback_placeholders(architectures: Sequence[str]) -> dict[str, Placeholder]:
    """What vLLM writes into a "string"-format prompt per image of a model the gateway has no
    processor for (the chat renderer takes image parts only, so far)."""
    return {"image": functools.partial(placeholder_for, tuple(architectures), "image")}


async def media_refs(
    items: Sequence[MediaItem], policy: MediaPolicy, http: httpx.AsyncClient | None
) -> pb.MediaRefs:
    """The items, fetched and checked under `policy`, as data: URLs in prompt order."""
    urls = [item.url for item in items]
    downloaded: list[bytes | None] = [None] * len(urls)
    if needs_download(urls):
        downloaded = await download_all(urls, policy, http)
    checked = await asyncio.to_thread(checked_sources, urls, downloaded, policy)
    return pb.MediaRefs(
        items=[
            pb.MediaRef(modality=MODALITIES[item.modality], url=_data_url(raw, mime))
            for item, (raw, mime) in zip(items, checked, strict=True)
        ]
    )


def _data_url(raw: bytes, mime: str) -> str:
    return f"data:{mime};base64,{pybase64.b64encode(raw).decode('ascii')}"
