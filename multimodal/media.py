"""Load client-supplied images: source string -> raw bytes -> RGB pixels.

Sources are ``http(s)://`` URLs, ``data:image/...;base64,`` URIs and, only when the operator
configured a root directory, ``file://`` paths under it. Everything treats the source as
hostile: network targets are checked after DNS resolution and again at connect time
(``multimodal.net_guard``), downloads are capped while streaming (``multimodal.fetch``), and
decoding refuses images whose header declares too many pixels before any pixel data is
decompressed, then reproduces vLLM 0.32's pixels exactly (``multimodal.decode``).
"""

from __future__ import annotations

import asyncio
import binascii
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit
from urllib.request import url2pathname

import httpx
import numpy as np
import pybase64
from PIL import Image

from multimodal.decode import check_header, decode_image, decode_pixels
from multimodal.errors import (
    MediaError,
    MediaFetchError,
    MediaForbiddenError,
    MediaSourceError,
)
from multimodal.fetch import create_http_client, fetch
from multimodal.policy import DEFAULT_IMAGE_FORMATS, MediaPolicy, byte_limit_error

__all__ = [
    "DEFAULT_IMAGE_FORMATS",
    "LoadedImage",
    "PendingImage",
    "checked_sources",
    "MediaPolicy",
    "create_http_client",
    "decode_image",
    "decode_source",
    "decode_sources",
    "download",
    "download_all",
    "load_image",
    "load_images",
    "pending_sources",
    "needs_download",
    "source_bytes",
]


@dataclass(frozen=True, eq=False)
class LoadedImage:
    """A decoded image and the exact bytes it came from (the input of the content hash)."""

    # RGB, EXIF orientation applied: a PIL image in mode "RGB", or the same pixels as an HxWx3
    # uint8 array when decode_pixels decoded a JPEG straight into numpy.
    decoded: Image.Image | np.ndarray
    data: bytes
    source_kind: str  # "http" | "data" | "file"
    mime: str | None  # sniffed from the bytes, not the (client-controlled) declared type

    @property
    def pixels(self) -> np.ndarray:
        """HxWx3 uint8 RGB; no copy when the image was decoded into an array."""
        return np.asarray(self.decoded)

    @property
    def image(self) -> Image.Image:
        """The image as PIL (built on demand when it was decoded into an array)."""
        if isinstance(self.decoded, Image.Image):
            return self.decoded
        return Image.fromarray(self.decoded)


# --------------------------------------------------------------------------------------------
# Public entry points


async def load_image(
    source: str, policy: MediaPolicy, client: httpx.AsyncClient | None = None
) -> LoadedImage:
    """Fetch and decode one image. Raises a ``MediaError`` subclass on any failure.

    ``client`` should come from ``create_http_client`` so the address policy is also enforced
    at connect time; any other client only gets the pre-request check (see ``fetch.fetch``).
    Without a client, a guarded one is created for this call.
    """
    downloaded = await download(source, policy, client)
    # Base64 decoding, file reads and image decoding are blocking; keep them off the loop.
    return await asyncio.to_thread(decode_source, source, downloaded, policy)


async def load_images(
    sources: Sequence[str],
    policy: MediaPolicy,
    client: httpx.AsyncClient | None = None,
    *,
    max_concurrency: int = 8,
) -> list[LoadedImage]:
    """Load several images concurrently (each decoded in its own worker thread), in order; a
    failure carries its ``index``. On the first failure the remaining loads are cancelled,
    because the request is going to be rejected anyway and their downloads would only waste
    bandwidth and memory."""
    return await _each_or_fail_fast(sources, policy, client, load_image, max_concurrency)


async def download(
    source: str, policy: MediaPolicy, client: httpx.AsyncClient | None = None
) -> bytes | None:
    """The bytes of an ``http(s)`` source, downloaded under the policy; ``None`` for ``data:``
    and ``file:`` sources, whose reading is blocking work left to ``decode_source``."""
    if _source_kind(source) != "http":
        return None
    if client is not None:
        return await fetch(source, policy, client)
    async with create_http_client(policy) as own_client:
        return await fetch(source, policy, own_client)


async def download_all(
    sources: Sequence[str],
    policy: MediaPolicy,
    client: httpx.AsyncClient | None = None,
    *,
    max_concurrency: int = 8,
) -> list[bytes | None]:
    """``download`` for each source, concurrently and failing fast like ``load_images``."""
    return await _each_or_fail_fast(sources, policy, client, download, max_concurrency)


def needs_download(sources: Sequence[str]) -> bool:
    """Whether any source is an http(s) URL, which ``download_all`` must fetch first; the
    others are read by ``decode_sources`` itself (``download_all`` gives None for them)."""
    return any(isinstance(s, str) and _source_kind_or_none(s) == "http" for s in sources)


def decode_source(source: str, downloaded: bytes | None, policy: MediaPolicy) -> LoadedImage:
    """Blocking: decode what ``download`` returned for ``source``, reading and decoding
    ``data:`` and ``file:`` sources here."""
    data, kind = source_bytes(source, downloaded, policy)
    return _decoded(data, kind, policy)


def source_bytes(source: str, downloaded: bytes | None, policy: MediaPolicy) -> tuple[bytes, str]:
    """Blocking: the encoded bytes of ``source`` (``downloaded`` for http(s), read here for
    ``data:`` and ``file:``) under the policy's byte and path rules, and the source's kind."""
    if downloaded is not None:
        return downloaded, "http"
    kind = _source_kind(source)
    if kind == "data":
        return _data_uri_bytes(source, policy), kind
    if kind == "file":
        return _file_url_bytes(source, policy), kind
    raise MediaSourceError("an http(s) image must be downloaded before it is decoded")


def checked_sources(
    sources: Sequence[str], downloaded: Sequence[bytes | None], policy: MediaPolicy
) -> list[tuple[bytes, str]]:
    """Blocking: each source's bytes and sniffed MIME type, checked as ``decode_sources``
    checks them (format allow-list, pixel limit from the header) without decoding pixels:
    for media another process decodes. A failure carries its ``index``."""
    checked = []
    for index, (source, data) in enumerate(zip(sources, downloaded, strict=True)):
        try:
            raw, _ = source_bytes(source, data, policy)
            checked.append((raw, check_header(raw, policy)))
        except MediaError as exc:
            exc.index = index
            raise
    return checked


def decode_sources(
    sources: Sequence[str], downloaded: Sequence[bytes | None], policy: MediaPolicy
) -> list[LoadedImage]:
    """Blocking: ``decode_source`` for each, in order, in the calling thread; a failure
    carries its ``index``."""
    images = []
    for index, (source, data) in enumerate(zip(sources, downloaded, strict=True)):
        try:
            images.append(decode_source(source, data, policy))
        except MediaError as exc:
            exc.index = index
            raise
    return images


class PendingImage:
    """An image whose bytes are read (under the policy's rules) but not yet decoded: with the
    media cache on, an item the cache holds is never decoded. Decodes on first use of its
    pixels; a failure then carries its ``index`` as ``decode_sources``' do."""

    def __init__(self, data: bytes, source_kind: str, policy: MediaPolicy, index: int) -> None:
        self.data = data
        self.source_kind = source_kind
        self._policy = policy
        self._index = index
        self._loaded: LoadedImage | None = None

    @property
    def loaded(self) -> LoadedImage:
        if self._loaded is None:
            try:
                self._loaded = _decoded(self.data, self.source_kind, self._policy)
            except MediaError as exc:
                exc.index = self._index
                raise
        return self._loaded

    @property
    def pixels(self) -> np.ndarray:
        return self.loaded.pixels


def pending_sources(
    sources: Sequence[str], downloaded: Sequence[bytes | None], policy: MediaPolicy
) -> list[PendingImage]:
    """Blocking: each source's bytes, read and checked as ``decode_sources`` reads them, to be
    decoded only if its pixels are needed; a failure carries its ``index``."""
    pending = []
    for index, (source, data) in enumerate(zip(sources, downloaded, strict=True)):
        try:
            raw, kind = source_bytes(source, data, policy)
        except MediaError as exc:
            exc.index = index
            raise
        pending.append(PendingImage(raw, kind, policy, index))
    return pending


async def _each_or_fail_fast(sources, policy, client, step, max_concurrency: int) -> list:
    if not sources:
        return []
    owns_client = client is None and any(_source_kind_or_none(s) == "http" for s in sources)
    shared = create_http_client(policy) if owns_client else client
    try:
        return await _all_or_fail_fast(sources, policy, shared, step, max_concurrency)
    finally:
        if owns_client and shared is not None:
            await shared.aclose()


async def _all_or_fail_fast(sources, policy, client, step, max_concurrency: int) -> list:
    semaphore = asyncio.Semaphore(max_concurrency)

    async def run_one(index: int, source: str):
        async with semaphore:
            try:
                return await step(source, policy, client)
            except MediaError as exc:
                exc.index = index
                raise

    tasks = [asyncio.ensure_future(run_one(i, s)) for i, s in enumerate(sources)]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in tasks:
            error = task.exception() if task.done() and not task.cancelled() else None
            if error is not None:
                raise error
        return [task.result() for task in tasks]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# --------------------------------------------------------------------------------------------
# Source dispatch


def _source_kind_or_none(source: str) -> str | None:
    if source[:5].lower() == "data:":
        return "data"
    scheme = source.partition(":")[0].lower()
    if scheme in ("http", "https"):
        return "http"
    if scheme == "file":
        return "file"
    return None


def _source_kind(source: str) -> str:
    if not isinstance(source, str) or not source:
        raise MediaSourceError("image source must be a non-empty URL string")
    kind = _source_kind_or_none(source)
    if kind is None:
        raise MediaSourceError("image URL must be an http(s), data or file URL")
    return kind


def _decoded(data: bytes, source_kind: str, policy: MediaPolicy) -> LoadedImage:
    decoded, mime = decode_pixels(data, policy)
    return LoadedImage(decoded=decoded, data=data, source_kind=source_kind, mime=mime)


# --------------------------------------------------------------------------------------------
# data: URIs


def _data_uri_bytes(source: str, policy: MediaPolicy) -> bytes:
    # RFC 2397: data:[<mediatype>][;<param>=<value>]*[;base64],<data>
    header, sep, payload = source[5:].partition(",")
    if not sep:
        raise MediaSourceError("malformed data URI: missing ','")
    params = [p.strip().lower() for p in header.split(";")]
    mime = params[0]
    if params[-1] != "base64" or len(params) < 2:
        raise MediaSourceError("data URI must be base64-encoded (';base64,')")
    kind = policy.media_kind
    # vLLM reads an audio data URI whatever its media type (an `input_audio` part becomes
    # `data:audio/<its format>;base64,...`, any string): the audio's bytes are sniffed.
    if kind != "audio" and not mime.startswith(f"{kind}/"):
        raise MediaSourceError(f"data URI media type must be {kind}/*, got {mime or 'none'!r}")
    # Refuse by encoded length first so an oversized payload is never decoded into memory.
    if len(payload) // 4 * 3 > policy.max_bytes + 2:
        raise byte_limit_error(policy.max_bytes, policy.media_kind)
    try:
        # As vLLM: validate=True rejects characters outside the alphabet and bad padding.
        # pybase64 (SIMD): 4 us for a 66 KB JPEG where the stdlib takes 200.
        data = pybase64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise MediaSourceError("data URI payload is not valid base64") from None
    if len(data) > policy.max_bytes:
        raise byte_limit_error(policy.max_bytes, policy.media_kind)
    return data


# --------------------------------------------------------------------------------------------
# file:// URLs

_OUTSIDE_ROOT = "file path is not under the allowed local media directory"


def _file_url_bytes(source: str, policy: MediaPolicy) -> bytes:
    root = policy.local_root
    if root is None:
        raise MediaForbiddenError("file:// URLs are disabled on this server")
    parts = urlsplit(source)
    if parts.netloc not in ("", "localhost"):
        raise MediaSourceError("file:// URLs must not name a remote host")
    path = Path(url2pathname(parts.path))  # also undoes percent-encoding, e.g. %2e%2e
    if not path.is_absolute():
        raise MediaSourceError("file:// URL must contain an absolute path")
    try:
        # Non-strict: a missing file must not be distinguishable from a forbidden one outside
        # the root, or the error would be an oracle for the server's file system.
        resolved = path.resolve()
    except (OSError, RuntimeError, ValueError):
        raise MediaForbiddenError(_OUTSIDE_ROOT) from None
    if root not in resolved.parents:
        raise MediaForbiddenError(_OUTSIDE_ROOT)
    return _read_regular_file(resolved, policy.max_bytes, policy.media_kind)


def _read_regular_file(path: Path, max_bytes: int, kind: str = "image") -> bytes:
    # The path was resolved and checked above; O_NOFOLLOW stops a final-component symlink
    # swapped in since. Swapping an intermediate directory remains possible for someone who can
    # write under the media root; that person is already trusted by the operator.
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise MediaFetchError("file not found") from None
    except OSError:
        raise MediaFetchError("file cannot be opened") from None
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        # FIFOs and devices could block forever or never end.
        if not stat.S_ISREG(info.st_mode):
            raise MediaForbiddenError("file path is not a regular file")
        if info.st_size > max_bytes:
            raise byte_limit_error(max_bytes, kind)
        data = fh.read(max_bytes + 1)  # the file may have grown since fstat
    if len(data) > max_bytes:
        raise byte_limit_error(max_bytes, kind)
    return data
