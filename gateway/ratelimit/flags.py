"""`mmgate serve`'s rate-limit flags, on SMG's names, and the limits they make.

None of them given: no limiter is made, nothing on the request path changes.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable
from pathlib import Path

from gateway.ratelimit.callers import parse_labelled_key
from gateway.ratelimit.policy import Limit, RateLimits, load_config

TENANT_KEYS_ENV = "MMGATE_TENANT_API_KEYS"

HELP = (
    "Token buckets on the generation routes: a request over a limit is refused with 429, a "
    "Retry-After header (whole seconds) and an OpenAI error body. With --api-server-count N "
    "every process holds its own buckets: --rate-limit-tokens-per-second is divided among "
    "them (the gateway's total stays the flag's), but the per-key limits are not (one "
    "client's connections may all reach one process), so a key spreading its requests over "
    "N processes can get up to N times its limits."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("rate limits", HELP)
    g.add_argument(
        "--rate-limit-tokens-per-second",
        type=_rate,
        default=None,
        metavar="N",
        help="sustained admission rate of generation requests, all callers together, in "
        "requests per second, bursting up to --max-in-flight (SMG's flag; SMG queues a "
        "request over it, mmgate answers 429 with Retry-After). Unset or 0: no limit",
    )
    g.add_argument(
        "--tenant-api-key",
        action="append",
        default=[],
        metavar="LABEL:KEY",
        help="a /v1 key with a label, which the rate-limit config and the metrics name it by "
        "(`auth:LABEL`); split at the first ':', so a label holds none (SMG's flag). Several "
        "keys may share a label: they share its buckets. Prefer --tenant-api-key-file or "
        f"${TENANT_KEYS_ENV}: a command line shows in `ps`. A key without a label is named "
        "`auth:sha256:` and its sha-256's first 12 hex digits",
    )
    g.add_argument(
        "--tenant-api-key-file",
        action="append",
        default=[],
        type=Path,
        metavar="PATH",
        help="a file of LABEL:KEY lines (`#` comments skipped); repeatable. --api-key-file "
        "lines stay whole keys, ':' and all",
    )
    g.add_argument(
        "--tenant-rate-limit-enabled",
        action="store_true",
        help="rate-limit each caller (SMG's flag): each key (by label, else by hash), or "
        "without /v1 keys each client address, gets its own buckets of requests and of "
        "generated tokens per second, from --tenant-rate-limit-config",
    )
    g.add_argument(
        "--tenant-rate-limit-config",
        type=Path,
        metavar="YAML",
        help="the limits: `default_policy:` and `tenants:` (a list of entries with "
        "`tenant_key: auth:LABEL`), each with requests_per_second, request_burst, "
        "generated_tokens_per_second, generated_token_burst (README: Rate limits). "
        "Generated tokens are charged as they come; a key in debt is refused until paid off",
    )


def _rate(text: str) -> float:
    value = float(text)
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a rate of at least 0, got {text}")
    return value


def read_labelled_keys(given: Iterable[str], files: Iterable[Path]) -> dict[str, str]:
    """key -> label from the flags, the files and $MMGATE_TENANT_API_KEYS (comma or line
    separated). ValueError (naming the flag or file, never a key) on a bad entry, OSError on
    an unreadable file; a key given two labels is refused."""
    entries = [(line, "--tenant-api-key") for line in given]
    for path in files:
        entries += [(line, str(path)) for line in _lines(Path(path).read_text())]
    env = _lines(os.environ.get(TENANT_KEYS_ENV, ""), commas=True)
    entries += [(line, f"${TENANT_KEYS_ENV}") for line in env]
    labels: dict[str, str] = {}
    for line, source in entries:
        try:
            label, key = parse_labelled_key(line)
        except ValueError as error:
            raise ValueError(f"{source}: {error}") from None
        if labels.setdefault(key, label) != label:
            raise ValueError(f"{source}: one key is given two labels ({labels[key]}, {label})")
    return labels


def _lines(text: str, commas: bool = False) -> list[str]:
    lines = []
    for line in text.splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        lines.extend(p for p in (line.split(",") if commas else [line]) if p.strip())
    return lines


def from_args(
    args: argparse.Namespace, labels: dict[str, str], max_in_flight: int, processes: int
) -> RateLimits | None:
    """This process's limits, or None when no limit is asked for. ValueError names what is
    wrong (and OSError an unreadable config)."""
    config = args.tenant_rate_limit_config
    if config is not None and not args.tenant_rate_limit_enabled:
        raise ValueError("--tenant-rate-limit-config needs --tenant-rate-limit-enabled")
    if args.tenant_rate_limit_enabled and config is None:
        raise ValueError("--tenant-rate-limit-enabled needs --tenant-rate-limit-config")
    rate = args.rate_limit_tokens_per_second or 0.0
    global_requests = None
    if rate > 0:
        # Divided among the processes: each holds its own bucket, and requests from many
        # clients spread over them, so the sum is the gateway-wide rate the flag names.
        global_requests = Limit(rate / processes, max(1.0, max_in_flight / processes))
    if config is None:
        return None if global_requests is None else RateLimits(global_requests)
    default, tenants = load_config(config, set(labels.values()))
    return RateLimits(global_requests, default, tenants)
