"""The buckets and the limiter on an injected clock: requests paid before, generated tokens
after (into debt), the waits a refusal reports, and callers forgotten only when it changes
nothing."""

from __future__ import annotations

import pytest

from gateway.ratelimit.bucket import TokenBucket
from gateway.ratelimit.limiter import SWEEP_AT, CallerBuckets, RateLimiter, Refusal
from gateway.ratelimit.policy import Limit, Policy, RateLimits


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_a_bucket_starts_full_and_refills_at_its_rate_up_to_its_burst(clock):
    bucket = TokenBucket(rate=2, burst=3, clock=clock)
    for _ in range(3):
        assert bucket.wait() == 0
        bucket.take()
    assert bucket.wait() == pytest.approx(0.5)  # one token at 2 a second
    clock.now += 0.25
    assert bucket.wait() == pytest.approx(0.25)
    clock.now += 100
    assert bucket.full() and bucket.level == 3  # never above the burst


def test_a_bucket_charged_into_debt_says_when_it_is_out(clock):
    bucket = TokenBucket(rate=10, burst=20, clock=clock)
    assert bucket.debt_wait() == 0
    bucket.charge(50)  # 30 tokens of debt at 10 a second
    assert bucket.debt_wait() == pytest.approx(3.0)
    clock.now += 2.9
    assert bucket.debt_wait() == pytest.approx(0.1)
    clock.now += 0.1
    assert bucket.debt_wait() == 0


@pytest.mark.parametrize(("rate", "burst"), [(0, 1), (1, 0), (-1, 1)])
def test_a_bucket_needs_a_rate_and_a_burst(rate, burst):
    with pytest.raises(ValueError):
        TokenBucket(rate, burst)


def _limiter(clock, default: Policy, tenants=None, global_requests=None) -> RateLimiter:
    return RateLimiter(RateLimits(global_requests, default, tenants or {}), clock)


def test_each_caller_has_its_own_request_bucket(clock):
    limiter = _limiter(clock, Policy(requests=Limit(1, 2)))
    for _ in range(2):
        assert isinstance(limiter.admit("auth:a"), CallerBuckets)
    refused = limiter.admit("auth:a")
    assert refused == Refusal("requests", pytest.approx(1.0), 1)
    assert isinstance(limiter.admit("auth:b"), CallerBuckets)  # b is not a's
    clock.now += 1
    assert isinstance(limiter.admit("auth:a"), CallerBuckets)


def test_generated_tokens_are_paid_after_so_requests_start_until_there_is_debt(clock):
    limiter = _limiter(clock, Policy(generated_tokens=Limit(100, 100)))
    first, second = limiter.admit("auth:a"), limiter.admit("auth:a")  # nothing owed yet
    assert isinstance(first, CallerBuckets) and isinstance(second, CallerBuckets)
    first.charge(100)  # the bucket is empty, not in debt
    assert isinstance(limiter.admit("auth:a"), CallerBuckets)
    second.charge(1)
    assert limiter.admit("auth:a") == Refusal("generated_tokens", pytest.approx(0.01), 100)


def test_a_caller_in_token_debt_waits_until_it_is_paid_off(clock):
    limiter = _limiter(clock, Policy(generated_tokens=Limit(100, 100)))
    running = limiter.admit("auth:a")
    running.charge(150)  # 50 in debt
    refused = limiter.admit("auth:a")
    assert refused == Refusal("generated_tokens", pytest.approx(0.5), 100)
    running.charge(100)  # a stream still running keeps charging: 150 in debt
    assert limiter.admit("auth:a").wait == pytest.approx(1.5)
    assert isinstance(limiter.admit("auth:other"), CallerBuckets)
    clock.now += 1.5
    assert isinstance(limiter.admit("auth:a"), CallerBuckets)


def test_a_refused_request_pays_nothing(clock):
    limiter = _limiter(
        clock, Policy(requests=Limit(1, 1), generated_tokens=Limit(10, 10)), global_requests=None
    )
    running = limiter.admit("auth:a")
    running.charge(20)  # in token debt for 1 s
    for _ in range(5):
        assert limiter.admit("auth:a").limit == "generated_tokens"
    clock.now += 1
    # the request bucket was not emptied by the refusals: it refilled to 1 and takes one
    assert isinstance(limiter.admit("auth:a"), CallerBuckets)


def test_tenants_have_their_own_policy_and_the_rest_the_default(clock):
    limiter = _limiter(
        clock,
        Policy(requests=Limit(1, 1)),
        {"auth:big": Policy(requests=Limit(10, 10)), "auth:free": Policy()},
    )
    assert sum(isinstance(limiter.admit("auth:big"), CallerBuckets) for _ in range(20)) == 10
    assert sum(isinstance(limiter.admit("auth:x"), CallerBuckets) for _ in range(20)) == 1
    assert sum(isinstance(limiter.admit("auth:free"), CallerBuckets) for _ in range(50)) == 50


def test_the_global_bucket_bounds_every_caller_together(clock):
    limiter = RateLimiter(RateLimits(Limit(rate=2, burst=4)), clock)
    admitted = [limiter.admit(f"ip:10.0.0.{i}") for i in range(6)]
    assert [isinstance(a, CallerBuckets) for a in admitted] == [True] * 4 + [False] * 2
    assert admitted[-1] == Refusal("global", pytest.approx(0.5), 2)
    assert limiter.callers == {}  # no per-caller limits: no per-caller buckets kept


def test_a_caller_refused_by_its_own_limit_takes_nothing_from_the_global_bucket(clock):
    limiter = RateLimiter(RateLimits(Limit(1, 2), Policy(requests=Limit(1, 1))), clock)
    assert isinstance(limiter.admit("auth:a"), CallerBuckets)
    for _ in range(10):
        assert limiter.admit("auth:a").limit == "requests"
    assert isinstance(limiter.admit("auth:b"), CallerBuckets)  # the global burst's second


def test_only_full_idle_callers_are_forgotten(clock):
    limiter = _limiter(clock, Policy(requests=Limit(1, 1)))
    for i in range(SWEEP_AT - 2):
        limiter.done(limiter.admit(f"ip:10.0.{i // 256}.{i % 256}"))
    running = limiter.admit("ip:10.9.9.9")  # a request still running: kept
    clock.now += 1  # every bucket so far is full again
    limiter.done(limiter.admit("ip:10.9.9.8"))  # done, but its bucket is empty: kept
    assert len(limiter.callers) == SWEEP_AT
    limiter.admit("ip:10.200.0.1")  # a new caller past the bound: the sweep runs
    assert set(limiter.callers) == {"ip:10.9.9.9", "ip:10.9.9.8", "ip:10.200.0.1"}
    assert limiter.callers["ip:10.9.9.9"] is running
