"""Load client-supplied images: source string -> raw bytes -> RGB ``PIL.Image``.

Sources are ``http(s)://`` URLs, ``data:image/...;base64,`` URIs and, only when the operator
configured a root directory, ``file://`` paths under it. Everything here treats the source as
hostile: network targets are checked after DNS resolution (and again at connect time, see
``create_http_client``), downloads are capped while streaming, and decoding refuses images whose
header declares too many pixels before any pixel data is decompressed.

Decoding reproduces vLLM 0.32's ``ImageMediaIO.load_bytes`` (vllm/multimodal/media/image.py with
the helpers in vllm/multimodal/image.py) step for step, so the pixels we hand to the processor
are exactly those vLLM would have produced from the same bytes. Any deviation there silently
changes model outputs, so it is pinned by tests that run vLLM's own function.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import ipaddress
import os
import socket
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path
from urllib.parse import urlsplit
from urllib.request import url2pathname

import httpcore
import httpx
from PIL import Image, ImageOps, UnidentifiedImageError

from multimodal.errors import (
    MediaDecodeError,
    MediaError,
    MediaFetchError,
    MediaForbiddenError,
    MediaSourceError,
    MediaTimeoutError,
    MediaTooLargeError,
)

__all__ = [
    "DEFAULT_IMAGE_FORMATS",
    "LoadedImage",
    "MediaPolicy",
    "create_http_client",
    "decode_image",
    "load_image",
    "load_images",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# Still-image formats whose Pillow decoders are in-process and widely exercised. vLLM accepts a
# much longer list (TIFF, PSD, ICO, ...); every extra parser is attack surface that OpenAI-style
# clients do not need, so operators must opt in via ``MediaPolicy.allowed_formats``.
DEFAULT_IMAGE_FORMATS: tuple[str, ...] = ("JPEG", "PNG", "WEBP", "GIF", "BMP")

# Instance-metadata endpoints hand out cloud credentials; a generic "allow private networks"
# choice should not expose them, so they need an explicit single-address allow entry.
_METADATA_ADDRESSES: frozenset[IPAddress] = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OCI, DigitalOcean, OpenStack
        "169.254.170.2",  # AWS ECS task credentials
        "fd00:ec2::254",  # AWS IMDS over IPv6
        "100.100.100.200",  # Alibaba Cloud
    )
)
_NAT64_PREFIX = ipaddress.ip_network("64:ff9b::/96")

_REQUEST_HEADERS = {
    "Accept": "image/*",
    # Images are already compressed; refusing transfer compression keeps the byte limit a limit
    # on what we buffer instead of on the compressed wire size.
    "Accept-Encoding": "identity",
}

_MiB = 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class MediaPolicy:
    """Operator limits for loading media. Field names follow vLLM's flags where one exists.

    - ``allowed_domains`` <- ``--allowed-media-domains``: when non-empty, an HTTP(S) URL's
      hostname (and every redirect's) must equal one of these exactly, as in vLLM. ``None`` or
      empty means any public host.
    - ``allowed_networks``: CIDRs the operator trusts even though they are not globally
      routable (e.g. ``"10.0.0.0/8"``, ``"127.0.0.1/32"``). Without them, loopback, private,
      link-local, CGNAT, multicast, unspecified and reserved addresses are refused. A cloud
      metadata address is only reachable if listed as a single address (``/32`` or ``/128``).
    - ``local_root`` <- ``--allowed-local-media-path``: ``file://`` URLs may read files under
      this directory; ``None`` refuses ``file://`` entirely.
    - ``max_pixels`` must stay at or below Pillow's ``MAX_IMAGE_PIXELS`` so any image we accept
      decodes without Pillow's own bomb warning.
    """

    allowed_domains: tuple[str, ...] | None = None
    allowed_networks: tuple[str, ...] = ()
    local_root: Path | None = None
    max_bytes: int = 20 * _MiB
    max_pixels: int = 64_000_000
    connect_timeout: float = 5.0
    read_timeout: float = 10.0
    total_timeout: float = 30.0
    max_redirects: int = 3
    allowed_formats: tuple[str, ...] = DEFAULT_IMAGE_FORMATS

    _networks: tuple[IPNetwork, ...] = field(init=False, repr=False, compare=False)
    _allowed_hosts: frozenset[IPAddress] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Frozen, so normalized values are written with object.__setattr__.
        domains = tuple(d.strip().lower() for d in self.allowed_domains or ())
        object.__setattr__(self, "allowed_domains", domains or None)
        try:
            networks = tuple(ipaddress.ip_network(n, strict=False) for n in self.allowed_networks)
        except ValueError as exc:
            raise ValueError(f"invalid allowed_networks entry: {exc}") from None
        object.__setattr__(self, "allowed_networks", tuple(str(n) for n in networks))
        object.__setattr__(self, "_networks", networks)
        hosts = frozenset(n.network_address for n in networks if n.num_addresses == 1)
        object.__setattr__(self, "_allowed_hosts", hosts)
        object.__setattr__(self, "allowed_formats", tuple(f.upper() for f in self.allowed_formats))

        if self.local_root is not None:
            # Resolved once so containment checks compare canonical paths, as vLLM does.
            root = Path(self.local_root).resolve()
            if not root.is_dir():
                raise ValueError(f"local media root {root} is not an existing directory")
            object.__setattr__(self, "local_root", root)

        for name in ("max_bytes", "max_pixels", "connect_timeout", "read_timeout", "total_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.max_redirects < 0:
            raise ValueError("max_redirects must be >= 0")
        pillow_limit = Image.MAX_IMAGE_PIXELS
        if pillow_limit is not None and self.max_pixels > pillow_limit:
            raise ValueError(
                f"max_pixels {self.max_pixels} exceeds Pillow's MAX_IMAGE_PIXELS {pillow_limit}"
            )
        if not self.allowed_formats:
            raise ValueError("allowed_formats must not be empty")


@dataclass(frozen=True, eq=False)
class LoadedImage:
    """A decoded image and the exact bytes it came from (the input of the content hash)."""

    image: Image.Image  # mode "RGB", EXIF orientation applied
    data: bytes
    source_kind: str  # "http" | "data" | "file"
    mime: str | None  # sniffed from the bytes, not the (client-controlled) declared type


# --------------------------------------------------------------------------------------------
# Public entry points


async def load_image(
    source: str, policy: MediaPolicy, client: httpx.AsyncClient | None = None
) -> LoadedImage:
    """Fetch and decode one image. Raises a ``MediaError`` subclass on any failure.

    ``client`` should come from ``create_http_client`` so the address policy is also enforced
    at connect time; any other client only gets the pre-request check (see ``_download``).
    Without a client, a guarded one is created for this call.
    """
    kind = _source_kind(source)
    # Base64 decoding, file reads and image decoding are blocking; keep them off the loop.
    if kind == "data":
        return await asyncio.to_thread(_load_data_uri, source, policy)
    if kind == "file":
        return await asyncio.to_thread(_load_file_url, source, policy)

    if client is not None:
        data = await _fetch(source, policy, client)
    else:
        async with create_http_client(policy) as own_client:
            data = await _fetch(source, policy, own_client)
    return await asyncio.to_thread(_decoded, data, "http", policy)


async def load_images(
    sources: Sequence[str],
    policy: MediaPolicy,
    client: httpx.AsyncClient | None = None,
    *,
    max_concurrency: int = 8,
) -> list[LoadedImage]:
    """Load several images concurrently, in order; a failure carries its ``index``.

    On the first failure the remaining loads are cancelled, because the request is going to be
    rejected anyway and their downloads would only waste bandwidth and memory.
    """
    if not sources:
        return []
    owns_client = client is None and any(_source_kind_or_none(s) == "http" for s in sources)
    shared = create_http_client(policy) if owns_client else client
    semaphore = asyncio.Semaphore(max_concurrency)

    async def load_one(index: int, source: str) -> LoadedImage:
        async with semaphore:
            try:
                return await load_image(source, policy, shared)
            except MediaError as exc:
                exc.index = index
                raise

    tasks = [asyncio.ensure_future(load_one(i, s)) for i, s in enumerate(sources)]
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
        if owns_client and shared is not None:
            await shared.aclose()


def decode_image(data: bytes, policy: MediaPolicy) -> Image.Image:
    """Decode encoded bytes to an RGB image exactly as vLLM would. CPU-bound and blocking."""
    return _decode(data, policy)[0]


def create_http_client(
    policy: MediaPolicy, *, limits: httpx.Limits | None = None
) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` that enforces ``policy``'s address rules when it connects.

    Its network backend resolves each hostname itself, checks every resolved address and then
    connects to one of exactly those addresses, so a DNS answer that changes between our check
    and the connection (DNS rebinding) cannot redirect us to an internal host. TLS still
    verifies the certificate against the hostname. Environment proxies are ignored: through a
    proxy we would check the proxy's address rather than the target's.
    """
    limits = limits or httpx.Limits(max_connections=32, max_keepalive_connections=8)
    return httpx.AsyncClient(
        transport=_GuardedTransport(policy, limits),
        trust_env=False,
        follow_redirects=False,
        headers={"User-Agent": "mmgate-media/0.1"},
        timeout=_http_timeout(policy),
    )


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
    image, mime = _decode(data, policy)
    return LoadedImage(image=image, data=data, source_kind=source_kind, mime=mime)


# --------------------------------------------------------------------------------------------
# data: URIs


def _load_data_uri(source: str, policy: MediaPolicy) -> LoadedImage:
    # RFC 2397: data:[<mediatype>][;<param>=<value>]*[;base64],<data>
    header, sep, payload = source[5:].partition(",")
    if not sep:
        raise MediaSourceError("malformed data URI: missing ','")
    params = [p.strip().lower() for p in header.split(";")]
    mime = params[0]
    if params[-1] != "base64" or len(params) < 2:
        raise MediaSourceError("data URI must be base64-encoded (';base64,')")
    if not mime.startswith("image/"):
        raise MediaSourceError(f"data URI media type must be image/*, got {mime or 'none'!r}")
    # Refuse by encoded length first so an oversized payload is never decoded into memory.
    if len(payload) // 4 * 3 > policy.max_bytes + 2:
        raise MediaTooLargeError(f"image exceeds the {_fmt_bytes(policy.max_bytes)} size limit")
    try:
        # validate=True rejects characters outside the alphabet and bad padding, like vLLM's
        # pybase64.b64decode(validate=True).
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise MediaSourceError("data URI payload is not valid base64") from None
    if len(data) > policy.max_bytes:
        raise MediaTooLargeError(f"image exceeds the {_fmt_bytes(policy.max_bytes)} size limit")
    return _decoded(data, "data", policy)


# --------------------------------------------------------------------------------------------
# file:// URLs


def _load_file_url(source: str, policy: MediaPolicy) -> LoadedImage:
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
        raise MediaForbiddenError(
            "file path is not under the allowed local media directory"
        ) from None
    if root not in resolved.parents:
        raise MediaForbiddenError("file path is not under the allowed local media directory")
    return _decoded(_read_regular_file(resolved, policy.max_bytes), "file", policy)


def _read_regular_file(path: Path, max_bytes: int) -> bytes:
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
            raise MediaTooLargeError(f"image exceeds the {_fmt_bytes(max_bytes)} size limit")
        data = fh.read(max_bytes + 1)  # the file may have grown since fstat
    if len(data) > max_bytes:
        raise MediaTooLargeError(f"image exceeds the {_fmt_bytes(max_bytes)} size limit")
    return data


# --------------------------------------------------------------------------------------------
# http(s):// URLs


async def _fetch(source: str, policy: MediaPolicy, client: httpx.AsyncClient) -> bytes:
    try:
        return await asyncio.wait_for(_download(source, policy, client), policy.total_timeout)
    except asyncio.TimeoutError:
        raise MediaTimeoutError(
            f"download did not finish within {policy.total_timeout:g} s"
        ) from None


async def _download(source: str, policy: MediaPolicy, client: httpx.AsyncClient) -> bytes:
    try:
        url = httpx.URL(source)
    except httpx.InvalidURL:
        raise MediaSourceError("malformed image URL") from None
    timeout = _http_timeout(policy)
    for hop in range(policy.max_redirects + 1):
        # Checked per hop so an allowed host cannot bounce us to a forbidden one. This check
        # alone leaves a DNS-rebinding window until the connect; the guarded client closes it by
        # re-resolving and re-checking inside its network backend.
        await _check_url(url, policy, redirected=hop > 0)
        host = url.host
        try:
            async with client.stream(
                "GET", url, headers=_REQUEST_HEADERS, timeout=timeout, follow_redirects=False
            ) as response:
                if response.is_redirect:
                    url = _redirect_target(response)
                    continue
                if response.status_code != httpx.codes.OK:
                    raise MediaFetchError(f"HTTP {response.status_code} from {host!r}")
                return await _read_limited(response, policy.max_bytes)
        except httpx.TimeoutException as exc:
            raise MediaTimeoutError(f"{_timeout_phase(exc)} from {host!r} timed out") from None
        except (httpx.InvalidURL, httpx.UnsupportedProtocol):
            raise MediaSourceError("malformed image URL") from None
        except httpx.HTTPError as exc:
            raise MediaFetchError(f"fetching from {host!r} failed ({type(exc).__name__})") from None
    raise MediaFetchError(f"more than {policy.max_redirects} redirects")


async def _check_url(url: httpx.URL, policy: MediaPolicy, *, redirected: bool) -> None:
    if url.scheme not in ("http", "https"):
        # Only reachable through a redirect: the initial scheme was dispatched on already.
        raise MediaForbiddenError("redirect to a non-HTTP(S) URL refused")
    host = url.host
    if not host:
        raise MediaSourceError("image URL has no host")
    if policy.allowed_domains is not None and host.lower() not in policy.allowed_domains:
        where = "redirect target" if redirected else "URL"
        raise MediaForbiddenError(f"{where} host {host!r} is not in the allowed media domains")
    port = url.port or (443 if url.scheme == "https" else 80)
    await _resolve_allowed(host, port, policy, policy.connect_timeout)


def _redirect_target(response: httpx.Response) -> httpx.URL:
    try:
        return response.url.join(response.headers["location"])
    except httpx.InvalidURL:
        raise MediaFetchError("redirect to a malformed URL") from None


async def _read_limited(response: httpx.Response, max_bytes: int) -> bytes:
    declared = response.headers.get("content-length", "")
    # A declared size lets us refuse without reading; an absent or lying header is caught
    # by counting what actually arrives.
    if declared.isdigit() and int(declared) > max_bytes:
        raise MediaTooLargeError(f"image exceeds the {_fmt_bytes(max_bytes)} size limit")
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > max_bytes:
            # Leaving the stream context closes the connection, so the rest is never read.
            raise MediaTooLargeError(f"image exceeds the {_fmt_bytes(max_bytes)} size limit")
    return bytes(body)


def _http_timeout(policy: MediaPolicy) -> httpx.Timeout:
    return httpx.Timeout(
        connect=policy.connect_timeout,
        read=policy.read_timeout,
        write=policy.read_timeout,
        pool=policy.connect_timeout,
    )


def _timeout_phase(exc: httpx.TimeoutException) -> str:
    if isinstance(exc, httpx.ConnectTimeout):
        return "connecting"
    if isinstance(exc, httpx.PoolTimeout):
        return "waiting for a connection"
    return "reading"


# --------------------------------------------------------------------------------------------
# Address policy


async def _resolve_allowed(
    host: str, port: int, policy: MediaPolicy, timeout: float | None
) -> list[str]:
    """Resolve ``host`` and return its addresses, refusing if any of them is not allowed.

    Refusing on *any* bad address (rather than skipping it) keeps the outcome independent of
    which address a later resolution or connect attempt happens to pick.
    """
    loop = asyncio.get_running_loop()
    try:
        infos = await asyncio.wait_for(
            loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), timeout
        )
    except asyncio.TimeoutError:
        raise MediaTimeoutError(f"resolving host {host!r} timed out") from None
    except (OSError, UnicodeError):
        raise MediaFetchError(f"cannot resolve host {host!r}") from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not addresses:
        raise MediaFetchError(f"cannot resolve host {host!r}")
    for address in addresses:
        # Strip an IPv6 zone ("fe80::1%eth0"); the zone does not change the category.
        category = _refusal(ipaddress.ip_address(address.partition("%")[0]), policy)
        if category is not None:
            raise MediaForbiddenError(
                f"host {host!r} resolves to a {category} address, which this server does not "
                "fetch from"
            )
    return addresses


def _refusal(ip: IPAddress, policy: MediaPolicy) -> str | None:
    """The category that makes ``ip`` forbidden under ``policy``, or ``None`` if allowed."""
    if ip in _METADATA_ADDRESSES and ip not in policy._allowed_hosts:
        return "cloud metadata"
    if any(ip in network for network in policy._networks):
        return None
    if isinstance(ip, ipaddress.IPv6Address):
        # IPv4 carried inside IPv6 reaches the IPv4 host; judge that host instead.
        embedded = _embedded_ipv4(ip)
        if embedded is not None:
            return _refusal(embedded, policy)
    for category, flagged in (
        ("loopback", ip.is_loopback),
        ("unspecified", ip.is_unspecified),
        ("link-local", ip.is_link_local),
        ("multicast", ip.is_multicast),
        ("reserved", ip.is_reserved),  # before "private": 240.0.0.0/4 is both
        ("private", ip.is_private),
    ):
        if flagged:
            return category
    # Catches the rest of the special-purpose ranges, e.g. CGNAT 100.64.0.0/10.
    return None if ip.is_global else "non-public"


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64_PREFIX:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


class _GuardedNetworkBackend(httpcore.AsyncNetworkBackend):
    """Resolves, checks and connects to the checked address in one step (no rebinding gap)."""

    def __init__(self, policy: MediaPolicy) -> None:
        self._policy = policy
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        # Our MediaErrors pass through httpcore and httpx unchanged (they only translate their
        # own exception types), so the caller sees the precise refusal.
        addresses = await _resolve_allowed(host, port, self._policy, timeout)
        last_error: Exception | None = None
        for address in addresses:
            try:
                return await self._inner.connect_tcp(
                    address,
                    port,
                    timeout=timeout,
                    local_address=local_address,
                    socket_options=socket_options,
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last_error = exc
        assert last_error is not None
        raise last_error

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise MediaForbiddenError("unix sockets are not a media source")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _GuardedTransport(httpx.AsyncHTTPTransport):
    def __init__(self, policy: MediaPolicy, limits: httpx.Limits) -> None:
        ssl_context = httpx.create_ssl_context()
        super().__init__(verify=ssl_context, trust_env=False, limits=limits)
        # httpx exposes no public hook for httpcore's network backend; swapping the pool it
        # built is the smallest way in. Fail loudly if a new httpx changes this layout rather
        # than silently losing the connect-time check.
        if not isinstance(getattr(self, "_pool", None), httpcore.AsyncConnectionPool):
            raise RuntimeError("unsupported httpx version: cannot install the guarded backend")
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=ssl_context,
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=_GuardedNetworkBackend(policy),
        )


# --------------------------------------------------------------------------------------------
# Decoding (mirrors vllm.multimodal.media.image.ImageMediaIO.load_bytes, vLLM 0.32)


def _decode(data: bytes, policy: MediaPolicy) -> tuple[Image.Image, str | None]:
    try:
        # Not used as a context manager: the file is an in-memory buffer, and the result may be
        # the opened image itself, which must stay usable.
        image = Image.open(BytesIO(data), formats=policy.allowed_formats)
        mime = image.get_format_mimetype()
        # Image.open only parsed the header; refuse before any pixel is decompressed.
        width, height = image.size
        if width * height > policy.max_pixels:
            raise MediaTooLargeError(
                f"image is {width}x{height} ({width * height} pixels), more than the "
                f"{policy.max_pixels} pixel limit"
            )
        image = _apply_exif_orientation(image)
        image.load()
        return _to_rgb(image), mime
    except MediaError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        # Raised by Image.open itself when the header is far beyond Pillow's global limit (the
        # warning only arrives as an exception if the process escalates warnings to errors).
        raise MediaTooLargeError(f"image dimensions are too large: {exc}") from None
    except UnidentifiedImageError:
        formats = ", ".join(policy.allowed_formats)
        raise MediaDecodeError(f"not a supported image (accepted formats: {formats})") from None
    except Exception as exc:
        # Pillow reports corrupt input through many types (OSError, SyntaxError, ValueError,
        # EOFError, struct.error, ...); for untrusted bytes they all mean the same thing.
        raise MediaDecodeError(f"corrupt or truncated image: {exc}") from None


def _apply_exif_orientation(image: Image.Image) -> Image.Image:
    # vllm.multimodal.image.normalize_image: transpose by the EXIF Orientation tag, and keep the
    # untransposed image if that fails (broken EXIF must not reject an otherwise valid image).
    with contextlib.suppress(Exception):
        image = ImageOps.exif_transpose(image)
    return image


def _to_rgb(image: Image.Image) -> Image.Image:
    # vLLM ImageMediaIO._convert_image_mode + convert_image_mode with the default white
    # background: already-RGB images are returned untouched (a tRNS colour key on an RGB PNG is
    # ignored); anything with alpha or a transparency entry is composited onto white through
    # RGBA; everything else (L, P, CMYK, I;16, 1, ...) goes through Pillow's convert("RGB").
    if image.mode == "RGB":
        return image
    if image.mode != "RGBA" and (
        image.mode in ("LA", "PA") or "transparency" in getattr(image, "info", {})
    ):
        image = image.convert("RGBA")
    if image.mode == "RGBA":
        return _composite_on_white(image)
    return image.convert("RGB")


def _composite_on_white(image: Image.Image) -> Image.Image:
    # vllm.multimodal.image.rgba_to_rgb: paste with the alpha band as mask, not alpha_composite,
    # which rounds differently.
    converted = Image.new("RGB", image.size, (255, 255, 255))
    converted.paste(image, mask=image.split()[3])
    return converted


def _fmt_bytes(n: int) -> str:
    return f"{n / _MiB:g} MiB" if n >= _MiB else f"{n} bytes"
