"""The buckets of one gateway process: one global request bucket and, per caller, a request
bucket and a generated-token bucket.

A caller is refused while its token bucket is in debt or its request bucket is empty, and
everyone while the global bucket is empty; the refusal says how long to wait. Per-caller
buckets are made on a caller's first request; a full one with no request running is the same
as a new one, so they are dropped when their number grows (callers by client address are not
bounded the way keys are).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

from gateway.ratelimit.bucket import Clock, TokenBucket
from gateway.ratelimit.callers import metric_label
from gateway.ratelimit.policy import Limit, Policy, RateLimits

LimitKind = Literal["requests", "generated_tokens", "global"]
SWEEP_AT = 1024  # callers held before the full, idle ones are dropped


@dataclass(frozen=True)
class Refusal:
    limit: LimitKind
    wait: float  # seconds until the request would be admitted
    rate: float  # the limit's rate, for the message


class RateCounters:
    """What the limiter reports per caller (its metric label): requests admitted and
    refused, and generated tokens. None of them is made unless a limiter is."""

    def __init__(self, metrics: Any) -> None:
        from prometheus_client import Counter

        r = metrics.registry
        self.admitted = Counter(
            "mmgate_rate_limit_admitted",
            "generation requests the rate limits let through, per caller (a key's label or "
            "hash, `open` without a key)",
            ["caller"],
            registry=r,
        )
        self.limited = Counter(
            "mmgate_rate_limited",
            "generation requests refused with 429 by a rate limit (requests, generated_tokens: "
            "the caller's; global: --rate-limit-tokens-per-second), per caller",
            ["caller", "limit"],
            registry=r,
        )
        self.generated = Counter(
            "mmgate_caller_generated_tokens",
            "output tokens generated, per caller",
            ["caller"],
            registry=r,
        )


class CallerBuckets:
    """One caller's buckets and the requests it has running (which keep it from being
    dropped: their tokens are still to be charged here)."""

    def __init__(self, policy: Policy, clock: Clock, label: str, counters: RateCounters | None):
        self.requests = _bucket(policy.requests, clock)
        self.tokens = _bucket(policy.generated_tokens, clock)
        self.running = 0
        self._generated = None if counters is None else counters.generated.labels(label)

    def charge(self, tokens: int) -> None:
        if self.tokens is not None:
            self.tokens.charge(tokens)
        if self._generated is not None:
            self._generated.inc(tokens)

    def refusal(self) -> Refusal | None:
        if self.tokens is not None and (wait := self.tokens.debt_wait()) > 0:
            return Refusal("generated_tokens", wait, self.tokens.rate)
        if self.requests is not None and (wait := self.requests.wait()) > 0:
            return Refusal("requests", wait, self.requests.rate)
        return None

    def idle(self) -> bool:
        return self.running == 0 and all(
            b is None or b.full() for b in (self.requests, self.tokens)
        )


def _bucket(limit: Limit | None, clock: Clock) -> TokenBucket | None:
    return None if limit is None else TokenBucket(limit.rate, limit.burst, clock)


class RateLimiter:
    def __init__(
        self, limits: RateLimits, clock: Clock = time.monotonic, metrics: Any = None
    ) -> None:
        self.limits, self.clock = limits, clock
        self.counters = RateCounters(metrics) if metrics is not None else None
        self.global_bucket = _bucket(limits.global_requests, clock)
        self.callers: dict[str, CallerBuckets] = {}
        self._sweep_at = SWEEP_AT

    def admit(self, caller: str) -> CallerBuckets | Refusal:
        """The caller's buckets, its request paid and counted as running (`done` ends it),
        or why it is refused. A refused request pays nothing."""
        buckets = self._buckets(caller)
        refusal = buckets.refusal() if buckets is not None else None
        glob = self.global_bucket
        if refusal is None and glob is not None and (wait := glob.wait()) > 0:
            refusal = Refusal("global", wait, glob.rate)
        label = metric_label(caller)
        if refusal is not None:
            if self.counters is not None:
                self.counters.limited.labels(label, refusal.limit).inc()
            return refusal
        if self.global_bucket is not None:
            self.global_bucket.take()
        if buckets is None:
            buckets = CallerBuckets(Policy(), self.clock, label, self.counters)
        elif buckets.requests is not None:
            buckets.requests.take()
        buckets.running += 1
        if self.counters is not None:
            self.counters.admitted.labels(label).inc()
        return buckets

    @staticmethod
    def done(buckets: CallerBuckets) -> None:
        buckets.running -= 1

    def _buckets(self, caller: str) -> CallerBuckets | None:
        buckets = self.callers.get(caller)
        if buckets is not None:
            return buckets
        policy = self.limits.policy(caller)
        if policy is None:
            return None
        if len(self.callers) >= self._sweep_at:
            self._sweep()
        buckets = CallerBuckets(policy, self.clock, metric_label(caller), self.counters)
        self.callers[caller] = buckets
        return buckets

    def _sweep(self) -> None:
        """Forget the callers whose buckets are full and idle; sweep again when the rest
        have doubled, so the cost stays constant per new caller."""
        self.callers = {c: b for c, b in self.callers.items() if not b.idle()}
        self._sweep_at = max(SWEEP_AT, 2 * len(self.callers))
