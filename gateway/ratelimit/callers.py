"""Who a request is, for rate limits and their metrics: a name that never holds the key.

As SMG names its tenants: `auth:<label>` for a key given a label (`--tenant-api-key
LABEL:KEY`), `auth:sha256:<first 12 hex of the key's sha-256>` for a key without one, and for
a request to an open /v1 (no key configured) `ip:<client address>`, or `anonymous` when the
server does not know the address (a unix socket).
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Mapping, Sequence

from starlette.types import Scope

# Set by ApiKeyMiddleware on the scope of a /v1 request whose key matched: that key's caller.
SCOPE_KEY = "mmgate.caller"
# Metrics name every caller without a key `open`: one label per client address would grow
# without bound.
OPEN = "open"
LABEL = re.compile(r"[A-Za-z0-9._-]+")


def key_hash(key: str) -> str:
    """The first 12 hex digits of the key's sha-256: enough to tell keys apart in a metric,
    nothing to recover a key from."""
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def key_caller(key: str, labels: Mapping[str, str]) -> str:
    label = labels.get(key)
    return f"auth:{label}" if label else f"auth:sha256:{key_hash(key)}"


def key_callers(keys: Sequence[str], labels: Mapping[str, str]) -> list[str]:
    """Each key's caller, in the keys' order (ApiKeyMiddleware's matched index)."""
    return [key_caller(k, labels) for k in keys]


def client_caller(scope: Scope) -> str:
    """A request without a key: its client address (uvicorn's, after any trusted
    X-Forwarded-For), or `anonymous`."""
    client = scope.get("client")
    if not client or not client[0]:
        return "anonymous"
    return f"ip:{client[0]}"


def metric_label(caller: str) -> str:
    return caller if caller.startswith("auth:") else OPEN


def parse_labelled_key(line: str) -> tuple[str, str]:
    """`LABEL:KEY` (SMG's `--tenant-api-key TENANT_ID:KEY`): split at the first ':', so a key
    may hold ':' but a label may not. The message of a ValueError never holds the key."""
    label, sep, key = line.partition(":")
    label, key = label.strip(), key.strip()
    if not sep or not key:
        raise ValueError("a labelled key is LABEL:KEY (no ':' or no key after it)")
    if not LABEL.fullmatch(label):
        raise ValueError(f"a key label is letters, digits, '.', '_' or '-': got {label!r}")
    return label, key


def canonical_caller(text: str) -> bool:
    """Whether `text` is a caller a request can be: catches a rate-limit entry that could
    never apply (a label without `auth:`, an address written in a form never produced)."""
    if text == "anonymous":
        return True
    if text.startswith("auth:sha256:"):
        return re.fullmatch(r"[0-9a-f]{12}", text.removeprefix("auth:sha256:")) is not None
    if text.startswith("auth:"):
        return LABEL.fullmatch(text.removeprefix("auth:")) is not None
    if text.startswith("ip:"):
        address = text.removeprefix("ip:")
        try:
            return str(ipaddress.ip_address(address)) == address
        except ValueError:
            return False
    return False
