"""Which network addresses media may be fetched from, enforced before a request and at connect.

Loopback, private, link-local, multicast, reserved and other non-global addresses are refused
unless the operator trusts their network; cloud metadata endpoints need an explicit
single-address entry; IPv4 embedded in IPv6 is judged as the IPv4 host it reaches.
``GuardedTransport`` re-resolves and re-checks inside httpcore's network backend and connects to
exactly the checked address, which closes the DNS-rebinding window left by a pre-request check.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable

import httpcore
import httpx

from multimodal.errors import MediaFetchError, MediaForbiddenError, MediaTimeoutError
from multimodal.policy import IPAddress, MediaPolicy

__all__ = ["GuardedTransport", "resolve_allowed"]

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


async def resolve_allowed(
    host: str, port: int, policy: MediaPolicy, timeout: float | None
) -> list[str]:
    """Resolve ``host`` and return its addresses, refusing if any of them is not allowed.

    Refusing on *any* bad address (rather than skipping it) keeps the outcome independent of
    which address a later resolution or connect attempt happens to pick.
    """
    addresses = await _resolve(host, port, timeout)
    for address in addresses:
        # Strip an IPv6 zone ("fe80::1%eth0"); the zone does not change the category.
        category = _refusal(ipaddress.ip_address(address.partition("%")[0]), policy)
        if category is not None:
            raise MediaForbiddenError(
                f"host {host!r} resolves to a {category} address, which this server does not "
                "fetch from"
            )
    return addresses


async def _resolve(host: str, port: int, timeout: float | None) -> list[str]:
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
        addresses = await resolve_allowed(host, port, self._policy, timeout)
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


class GuardedTransport(httpx.AsyncHTTPTransport):
    """An httpx transport whose connections go through the address-checking network backend."""

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
