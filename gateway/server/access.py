"""Who may call which surface: the keys for /v1, /admin and /metrics, read from flags, files and
the environment, and the posture line `mmgate serve` logs at start.

Keys are secrets: nothing here puts one in a log line, an error body or a repr. Children of
`--api-server-count` get them inside the pickled GatewayConfig, through multiprocessing's
pipe, never on a command line (`ps` shows argv, not a pipe's bytes).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import ssl
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gateway.ratelimit.policy import RateLimits
from gateway.server.tls import HttpTls
from gateway.workers.tls import WorkerTls, is_tls

log = logging.getLogger("mmgate.security")

MetricsAuth = Literal["open", "api-key", "admin"]
METRICS_AUTH: tuple[MetricsAuth, ...] = ("open", "api-key", "admin")

# vLLM 0.32 reads one key from $VLLM_API_KEY (and only when no --api-key is given; mmgate has
# always taken it alongside --api-key, and keeps doing so). Ours take several.
API_KEYS_ENV = "MMGATE_API_KEYS"
ADMIN_KEYS_ENV = "MMGATE_ADMIN_API_KEYS"


def split_keys(text: str) -> list[str]:
    """Keys from a file or an environment variable: one a line (commas also separate, so an
    env var can hold several on one line); blank lines and `#` comments are skipped."""
    keys = []
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        keys.extend(k.strip() for k in line.split(",") if k.strip())
    return keys


def read_keys(given: Iterable[str], files: Iterable[Path], env_vars: Iterable[str]) -> list[str]:
    """Every key from the flags, the files and the named environment variables, in that order,
    without repeats. An unreadable file raises OSError (naming the file, not its content)."""
    keys = [k.strip() for k in given if k and k.strip()]
    for path in files:
        keys.extend(split_keys(Path(path).read_text()))
    for name in env_vars:
        keys.extend(split_keys(os.environ.get(name, "")))
    return list(dict.fromkeys(keys))


def is_loopback(host: str) -> bool:
    """Whether a bind address reaches only this machine. A name other than localhost counts
    as not loopback: it may resolve to anything."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Surfaces:
    """What guards each surface: the keys it takes, () for open; None for /admin when off."""

    api: tuple[str, ...]
    admin: tuple[str, ...] | None
    metrics: tuple[str, ...]

    @classmethod
    def of(
        cls,
        api_keys: Sequence[str],
        admin_keys: Sequence[str],
        metrics_auth: MetricsAuth,
        admin_enabled: bool,
    ) -> Surfaces:
        # Without an admin key /admin takes the API keys, as before there was one.
        admin = tuple(admin_keys) or tuple(api_keys)
        metrics = {"open": (), "api-key": tuple(api_keys), "admin": admin}[metrics_auth]
        return cls(tuple(api_keys), admin if admin_enabled else None, metrics)

    def __repr__(self) -> str:  # never the keys
        admin = "off" if self.admin is None else len(self.admin)
        return f"Surfaces(api={len(self.api)}, admin={admin}, metrics={len(self.metrics)})"


def admin_enabled(host: str, admin_keys: Sequence[str], insecure_open_admin: bool) -> bool:
    """/admin answers on loopback, with an admin key, or when the operator says so."""
    return bool(admin_keys) or insecure_open_admin or is_loopback(host)


def posture(
    host: str,
    port: int,
    surfaces: Surfaces,
    admin_keyed: bool,
    playground: bool,
    workers: Sequence[str],
    http_tls: HttpTls | None = None,
    rate_limits: RateLimits | None = None,
    worker_tls: WorkerTls | None = None,
) -> tuple[str, bool]:
    """The start-up line naming each surface's guard and each hop's transport, and whether it
    is a warning: something answers without a credential, or in plain text, off loopback."""

    def guard(keys: tuple[str, ...], name: str) -> str:
        return f"{name} key required ({len(keys)} accepted)" if keys else "OPEN"

    metrics_key = "api" if surfaces.metrics == surfaces.api else "admin"
    if surfaces.admin is None:
        admin = "off (404: not loopback and no --admin-api-key; --insecure-open-admin opens it)"
    else:
        admin = guard(surfaces.admin, "admin" if admin_keyed else "api")
    # TLS only when every worker is grpcs:// (one grpc:// worker is a plain-text hop).
    tls_workers = [w for w in workers if is_tls(w)]
    hop = "TLS" if workers and len(tls_workers) == len(workers) else "plain text"
    if hop == "TLS" and worker_tls is not None and worker_tls.mutual:
        hop += ", client certificate sent (mutual TLS)"
    parts = {
        "http": _http_transport(http_tls),
        "/v1": guard(surfaces.api, "api"),
        "/admin": admin,
        "/metrics": guard(surfaces.metrics, metrics_key),
        "playground": "OPEN (a page holding no secret; its API calls need /v1's key)"
        if playground
        else "off",
        "rate limits": _rate_limits(rate_limits),
        "workers hop": hop,
    }
    exposed = not is_loopback(host)
    loose = [name for name, state in parts.items() if state.startswith(("OPEN", "plain"))]
    line = f"security posture on {host}:{port}: " + "; ".join(f"{k} {v}" for k, v in parts.items())
    if exposed and loose:
        line += f" -- open or plain text on a non-loopback address: {', '.join(loose)}"
    return line, exposed and bool(loose)


def _rate_limits(limits: RateLimits | None) -> str:
    if limits is None:
        return "none"
    parts = []
    if limits.global_requests is not None:
        parts.append(f"{limits.global_requests.rate:g} requests/s in all")
    if limits.default is not None:
        parts.append(f"per caller ({len(limits.tenants)} with their own)")
    return ", ".join(parts)


def _http_transport(http_tls: HttpTls | None) -> str:
    if http_tls is None:
        return "plain text (no TLS)"
    if http_tls.cert_reqs == ssl.CERT_REQUIRED:
        return "TLS, client certificate required"
    return "TLS"


def log_posture(line: str, warn: bool) -> None:
    log.log(logging.WARNING if warn else logging.INFO, "%s", line)
