"""Download an image over http(s) under a ``MediaPolicy``.

Redirects are followed by hand so every hop's URL passes the domain and address checks, the
body is counted while streaming so a large or endless response is cut off at the byte limit,
and every httpx failure becomes a client-facing ``MediaError``.
"""

from __future__ import annotations

import asyncio

import httpx

from multimodal.errors import (
    MediaError,
    MediaFetchError,
    MediaForbiddenError,
    MediaSourceError,
    MediaTimeoutError,
)
from multimodal.net_guard import GuardedTransport, resolve_allowed
from multimodal.policy import MediaPolicy, byte_limit_error

__all__ = ["create_http_client", "fetch"]

_REQUEST_HEADERS = {
    "Accept": "image/*",
    # Images are already compressed; refusing transfer compression keeps the byte limit a limit
    # on what we buffer instead of on the compressed wire size.
    "Accept-Encoding": "identity",
}

_MALFORMED_URL = "malformed image URL"


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
        transport=GuardedTransport(policy, limits),
        trust_env=False,
        follow_redirects=False,
        headers={"User-Agent": "mmgate-media/0.1"},
        timeout=_http_timeout(policy),
    )


async def fetch(source: str, policy: MediaPolicy, client: httpx.AsyncClient) -> bytes:
    """The body of the http(s) URL ``source``. Raises a ``MediaError`` subclass on any failure.

    A ``client`` not made by ``create_http_client`` only gets the pre-request address check,
    which leaves a DNS-rebinding window until the connect.
    """
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
        raise MediaSourceError(_MALFORMED_URL) from None
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
                return await _read_limited(response, policy.max_bytes, policy.media_kind)
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise _as_media_error(exc, host) from None
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
    await resolve_allowed(host, port, policy, policy.connect_timeout)


def _redirect_target(response: httpx.Response) -> httpx.URL:
    try:
        return response.url.join(response.headers["location"])
    except httpx.InvalidURL:
        raise MediaFetchError("redirect to a malformed URL") from None


async def _read_limited(response: httpx.Response, max_bytes: int, kind: str) -> bytes:
    declared = response.headers.get("content-length", "")
    # A declared size lets us refuse without reading; an absent or lying header is caught
    # by counting what actually arrives.
    if declared.isdigit() and int(declared) > max_bytes:
        raise byte_limit_error(max_bytes, kind)
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > max_bytes:
            # Leaving the stream context closes the connection, so the rest is never read.
            raise byte_limit_error(max_bytes, kind)
    return bytes(body)


def _http_timeout(policy: MediaPolicy) -> httpx.Timeout:
    return httpx.Timeout(
        connect=policy.connect_timeout,
        read=policy.read_timeout,
        write=policy.read_timeout,
        pool=policy.connect_timeout,
    )


def _as_media_error(exc: httpx.HTTPError | httpx.InvalidURL, host: str) -> MediaError:
    # Names the exception type but not its text, which can contain resolved addresses.
    if isinstance(exc, httpx.TimeoutException):
        return MediaTimeoutError(f"{_timeout_phase(exc)} from {host!r} timed out")
    if isinstance(exc, (httpx.InvalidURL, httpx.UnsupportedProtocol)):
        return MediaSourceError(_MALFORMED_URL)
    return MediaFetchError(f"fetching from {host!r} failed ({type(exc).__name__})")


def _timeout_phase(exc: httpx.TimeoutException) -> str:
    if isinstance(exc, httpx.ConnectTimeout):
        return "connecting"
    if isinstance(exc, httpx.PoolTimeout):
        return "waiting for a connection"
    return "reading"
