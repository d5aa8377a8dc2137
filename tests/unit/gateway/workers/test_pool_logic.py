"""The pool's decision rules on their own: policies, prefix index, admission, breaker, health."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

import pytest

from gateway.errors import GatewayError
from gateway.server.admission import Admission
from gateway.workers.health import CLOSED, HALF_OPEN, OPEN, CircuitBreaker, HealthGate
from gateway.workers.routing import BLOCK_TOKENS, PrefixIndex, Router


@dataclass(eq=False)
class W:
    url: str
    assigned: int = 0


def workers(n: int = 3) -> list[W]:
    return [W(f"grpc://10.0.0.{i}:1") for i in range(n)]


def test_round_robin_cycles():
    ws, router = workers(), Router("round_robin")
    assert [router.choose(ws).worker for _ in range(6)] == ws + ws


def test_least_requests_picks_the_least_loaded_and_rotates_among_equals():
    ws, router = workers(), Router("least_requests")
    ws[0].assigned, ws[1].assigned, ws[2].assigned = 3, 1, 1
    chosen = {router.choose(ws).worker.url for _ in range(4)}
    assert chosen == {ws[1].url, ws[2].url}


def test_power_of_two_never_picks_the_most_loaded_of_its_pair():
    ws, router = workers(), Router("power_of_two", rng=random.Random(3))
    ws[0].assigned = 10
    picks = [router.choose(ws).worker for _ in range(200)]
    assert ws[0] not in picks and {ws[1], ws[2]} <= set(picks)


def prompt(prefix: int, length: int = 256, tail: int = 0) -> list[int]:
    return [prefix] * length + list(range(tail))


def test_cache_aware_follows_the_prefix():
    ws, router = workers(), Router("cache_aware")
    homes = {p: router.choose(ws, prompt(p)).worker for p in (1, 2, 3)}
    assert len(set(homes.values())) == 3  # new prefixes spread by load... and index size
    for p in (1, 2, 3, 2, 1):
        decision = router.choose(ws, prompt(p, tail=40))
        assert decision.worker is homes[p] and decision.outcome == "cache_hit"
        assert decision.matched_tokens >= 256  # revisits also match the tail seen before


def test_cache_aware_balances_when_imbalanced_or_short_match():
    ws, router = workers(2), Router("cache_aware", balance_threshold=2)
    home = router.choose(ws, prompt(7)).worker
    home.assigned = 5
    decision = router.choose(ws, prompt(7))
    assert decision.outcome == "imbalanced" and decision.worker is not home
    home.assigned = 0
    # shares only the first block of 32: below the 0.5 threshold
    short = prompt(7, length=BLOCK_TOKENS) + [9] * 16 * BLOCK_TOKENS
    assert router.choose(ws, short).outcome == "cache_miss"


def test_prefix_index_is_bounded_lru():
    index = PrefixIndex(max_blocks_per_worker=4)
    old, new = PrefixIndex.block_hashes(prompt(1, 64)), PrefixIndex.block_hashes(prompt(2, 64))
    index.insert("w", old)
    index.insert("w", new)
    assert index.size("w") == 4
    assert index.matched_blocks("w", new) == 4 and index.matched_blocks("w", old) == 0


def test_admission_queues_refuses_and_times_out():
    async def run():
        admission = Admission(max_in_flight=2, max_queue=1, queue_timeout=0.3)
        assert await admission.enter() == 0 and await admission.enter() == 0
        waiting = asyncio.create_task(admission.enter())
        await asyncio.sleep(0.05)
        assert admission.queue_depth == 1
        with pytest.raises(GatewayError) as full:
            await admission.enter()
        assert full.value.status == 429
        admission.leave()  # the slot goes straight to the waiter
        assert await waiting > 0 and admission.in_flight == 2
        queued = asyncio.create_task(admission.enter())
        with pytest.raises(GatewayError) as late:
            await queued
        assert late.value.status == 503 and admission.queue_depth == 0
        admission.leave()
        admission.leave()
        assert admission.in_flight == 0

    asyncio.run(run())


def test_admission_cancelled_waiter_leaves_the_line():
    async def run():
        admission = Admission(max_in_flight=1, max_queue=5, queue_timeout=5)
        await admission.enter()
        waiter = asyncio.create_task(admission.enter())
        await asyncio.sleep(0.01)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        assert admission.queue_depth == 0
        admission.leave()
        assert admission.in_flight == 0

    asyncio.run(run())


def test_circuit_breaker_opens_cools_down_and_closes():
    now = [0.0]
    breaker = CircuitBreaker(failures=3, cooldown=10, clock=lambda: now[0])
    for _ in range(2):
        breaker.record(False)
    assert breaker.state == CLOSED
    breaker.record(False)
    assert breaker.state == OPEN and not breaker.allows()
    now[0] = 10
    assert breaker.state == HALF_OPEN and breaker.allows()
    breaker.record(False)  # the trial failed
    assert breaker.state == OPEN
    now[0] = 20
    breaker.record(True)
    assert breaker.state == CLOSED


def test_health_gate_has_hysteresis():
    gate = HealthGate(fall=3, rise=2, healthy=True)
    assert [gate.record(False) for _ in range(3)] == [False, False, True]
    assert not gate.healthy
    assert gate.record(True) is False and gate.record(False) is False
    assert [gate.record(True) for _ in range(2)] == [False, True] and gate.healthy
