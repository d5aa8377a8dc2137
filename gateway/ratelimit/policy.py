"""What the limits are: SMG's tenant-rate-limit YAML shape, in requests and generated tokens
per second.

    default_policy:                      # every caller not listed below
      requests_per_second: 5
      request_burst: 10                  # optional; default: one second's worth (at least 1)
      generated_tokens_per_second: 200
      generated_token_burst: 4000        # optional; default: one second's worth
    tenants:
      - tenant_key: auth:team-red        # a key given the label team-red (--tenant-api-key)
        requests_per_second: 50
      - tenant_key: auth:sha256:3f2a9c01d4e5   # an unlabelled key, by its hash
        generated_tokens_per_second: 1000

SMG's entries (`tokens_per_minute`, `requests_per_minute`, both required) count a minute and
prompt plus completion tokens, reserved from an estimate of the prompt and trued up at the
end. Here the names say what is counted: generated tokens only (known as they come; the
prompt's cost is the request's), per second with an explicit burst. A limit left out is no
limit of that kind; a tenant's entry replaces the default as a whole (as SMG's does), so a
tenant can be exempted with an entry holding no limit. Unknown fields are refused, as SMG
refuses them (a misspelt field would otherwise silently be no limit).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gateway.ratelimit.callers import canonical_caller


@dataclass(frozen=True)
class Limit:
    rate: float  # tokens a second
    burst: float  # the most held at once


@dataclass(frozen=True)
class Policy:
    requests: Limit | None = None
    generated_tokens: Limit | None = None


@dataclass(frozen=True)
class RateLimits:
    """Every limit of one gateway process. `default` None: no per-caller limits (only the
    global one); `global_requests`: `--rate-limit-tokens-per-second`, all callers together."""

    global_requests: Limit | None = None
    default: Policy | None = None
    tenants: Mapping[str, Policy] = field(default_factory=dict)

    def policy(self, caller: str) -> Policy | None:
        if self.default is None:
            return None
        return self.tenants.get(caller, self.default)


_FIELDS = {
    "requests_per_second",
    "request_burst",
    "generated_tokens_per_second",
    "generated_token_burst",
}


def _limit(entry: Mapping[str, Any], rate_name: str, burst_name: str, where: str) -> Limit | None:
    rate, burst = entry.get(rate_name), entry.get(burst_name)
    if rate is None:
        if burst is not None:
            raise ValueError(f"{where}: {burst_name} without {rate_name}")
        return None
    rate = _positive(rate, f"{where}.{rate_name}")
    if burst is None:
        return Limit(rate, max(1.0, rate))
    return Limit(rate, _positive(burst, f"{where}.{burst_name}"))


def _positive(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{where} must be a number above 0, got {value!r}")
    if value == float("inf"):
        raise ValueError(f"{where} must be finite")
    return float(value)


def parse_policy(entry: Any, where: str, allowed: set[str]) -> Policy:
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where} must be a mapping")
    unknown = set(entry) - allowed
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
    requests = _limit(entry, "requests_per_second", "request_burst", where)
    tokens = _limit(entry, "generated_tokens_per_second", "generated_token_burst", where)
    return Policy(requests, tokens)


def parse_config(data: Any, labels: set[str]) -> tuple[Policy, dict[str, Policy]]:
    """The default policy and the tenants' from the parsed YAML. `labels`: the key labels
    given, so an `auth:<label>` naming none is refused (it could never apply)."""
    if not isinstance(data, Mapping):
        raise ValueError("the tenant rate-limit config must be a mapping")
    unknown = set(data) - {"default_policy", "tenants"}
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(sorted(map(str, unknown)))}")
    if "default_policy" not in data:
        raise ValueError("default_policy is required")
    default = parse_policy(data["default_policy"], "default_policy", _FIELDS)
    tenants: dict[str, Policy] = {}
    entries = data.get("tenants") or []
    if not isinstance(entries, list):
        raise ValueError("tenants must be a list")
    for index, entry in enumerate(entries):
        where = f"tenants[{index}]"
        key = entry.get("tenant_key") if isinstance(entry, Mapping) else None
        if not isinstance(key, str) or not key:
            raise ValueError(f"{where} is missing tenant_key")
        if not canonical_caller(key):
            raise ValueError(
                f"{where}: tenant_key {key!r} is none a request can have (auth:<label>, "
                "auth:sha256:<12 hex>, ip:<address> or anonymous)"
            )
        label = key.removeprefix("auth:")
        if key.startswith("auth:") and not key.startswith("auth:sha256:") and label not in labels:
            raise ValueError(f"{where}: no key has the label {label!r} (--tenant-api-key)")
        if key in tenants:
            raise ValueError(f"{where}: tenant_key {key!r} is listed twice")
        tenants[key] = parse_policy(entry, where, _FIELDS | {"tenant_key"})
    return default, tenants


def load_config(path: Path, labels: set[str]) -> tuple[Policy, dict[str, Policy]]:
    """The file's policies; OSError or ValueError (yaml's errors become ValueError)."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as error:
        raise ValueError(f"{path} is not valid YAML: {error}") from None
    try:
        return parse_config(data, labels)
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None
