"""Media for the worker to preprocess: fetched and checked by the gateway, sent as data: URLs."""

from __future__ import annotations

import asyncio
import base64
import io

import pytest
from PIL import Image

from gateway.render.messages import MediaItem
from gateway.render.worker_media import media_refs, mm_processing_mode
from multimodal.errors import MediaError
from multimodal.media import MediaPolicy
from protos import common_pb2
from tests.support.http_files import serve_bytes


def png(width: int = 20, height: int = 10) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 10, 10)).save(buffer, format="PNG")
    return buffer.getvalue()


def data_url(raw: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(raw).decode()}"


def refs(urls, policy=None):
    items = [MediaItem("image", url) for url in urls]
    return asyncio.run(media_refs(items, policy or MediaPolicy(), None))


def test_items_become_data_urls_of_the_checked_bytes_in_prompt_order():
    first, second = png(20, 10), png(7, 30)
    # the declared type is the client's; the forwarded one is sniffed from the bytes
    out = refs([data_url(first, "image/jpeg"), data_url(second)])
    assert [ref.modality for ref in out.items] == [common_pb2.IMAGE] * 2
    assert [ref.url for ref in out.items] == [data_url(first), data_url(second)]


def test_an_allowed_http_url_is_fetched_by_the_gateway_and_inlined():
    raw = png()
    policy = MediaPolicy(allowed_networks=("127.0.0.0/8",))
    with serve_bytes(raw) as base:
        out = refs([f"{base}/a.png"], policy)
    assert out.items[0].url == data_url(raw)


def test_the_gateway_media_policy_still_applies():
    with serve_bytes(png()) as base, pytest.raises(MediaError, match="image 0:.*loopback address"):
        refs([f"{base}/a.png"])  # loopback, not allowed by default
    with pytest.raises(MediaError, match="image 0: image is 400x300.*pixel limit"):
        refs([data_url(png(400, 300))], MediaPolicy(max_pixels=10_000))
    with pytest.raises(MediaError, match="image 1: not a supported image"):
        refs([data_url(png()), data_url(b"not an image")])
    with pytest.raises(MediaError, match="file:// URLs are disabled"):
        refs(["file:///etc/passwd"])


def test_mm_processing_takes_smg_s_name_for_the_gateway():
    assert [mm_processing_mode(m) for m in ("auto", "gateway", "worker", "router")] == [
        "auto",
        "gateway",
        "worker",
        "gateway",
    ]
    with pytest.raises(ValueError, match="auto|gateway|worker"):
        mm_processing_mode("both")
