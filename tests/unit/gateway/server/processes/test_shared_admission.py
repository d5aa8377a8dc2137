"""SharedAdmission: --max-in-flight and --max-queue bound the whole multi-process gateway.

The bound and the reclaiming of a dead process's slots are tested with real processes
(spawned, as the supervisor starts them); the queue's rules with two processes' admissions
over one table in one event loop, where the timing is ours to fix."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from gateway.errors import GatewayError
from gateway.server.processes.shared import (
    IN_FLIGHT,
    NO_TICKET,
    QUEUED,
    ProcessTable,
    SharedAdmission,
    make_context,
)
from tests.support.shared_admission_load import MAX_IN_FLIGHT, hammer, hold


def test_processes_hammering_it_never_exceed_the_bound():
    """Two spawned processes and this one, 40 requests each at once, bound 3."""
    ctx = make_context()
    table, results = ProcessTable(ctx, 3), ctx.Queue()
    procs = [ctx.Process(target=hammer, args=(table, i, 40, results)) for i in (1, 2)]
    for p in procs:
        p.start()
    hammer(table, 0, 40, results)
    reports = [results.get(timeout=60) for _ in range(3)]
    for p in procs:
        p.join(10)
    assert sorted(r[0] for r in reports) == [0, 1, 2]
    assert all(served == 40 for _, _, served in reports)
    assert max(most for _, most, _ in reports) == MAX_IN_FLIGHT  # reached, never passed
    assert table.total(IN_FLIGHT) == table.total(QUEUED) == 0


def test_a_dead_process_slots_are_reclaimed_for_the_others():
    ctx = make_context()
    table, held = ProcessTable(ctx, 2), ctx.Event()
    other = ctx.Process(target=hold, args=(table, 1, MAX_IN_FLIGHT, held))
    other.start()
    try:
        assert held.wait(30)

        async def main() -> float:
            admission = SharedAdmission(table, 0, MAX_IN_FLIGHT, 10, 30)
            waiting = asyncio.create_task(admission.enter())
            await asyncio.sleep(0.1)
            assert not waiting.done() and admission.queue_depth == 1  # all slots are held
            os.kill(other.pid, signal.SIGKILL)
            await asyncio.to_thread(other.join)
            table.reclaim(1)  # what the supervisor does for a dead child
            await asyncio.wait_for(waiting, 5)
            return table.total(IN_FLIGHT)

        assert asyncio.run(main()) == 1
    finally:
        other.kill()


@pytest.fixture
def pair():
    """Two processes' admissions over one table (in one loop)."""
    table = ProcessTable(make_context(), 2)

    def admissions(max_in_flight=1, max_queue=2, queue_timeout=5.0):
        return [SharedAdmission(table, i, max_in_flight, max_queue, queue_timeout) for i in (0, 1)]

    return table, admissions


def test_a_full_gateway_queue_is_refused_whichever_process_holds_it(pair):
    table, admissions = pair

    async def main() -> None:
        a, b = admissions(max_in_flight=1, max_queue=2)
        await a.enter()
        queued = [asyncio.create_task(b.enter()), asyncio.create_task(a.enter())]
        await asyncio.sleep(0.01)
        assert (a.queue_depth, b.queue_depth, a.in_flight) == (2, 2, 1)
        with pytest.raises(GatewayError) as refused:
            await b.enter()
        assert refused.value.status == 429
        a.leave()  # b's waiter is first in line: b's poll takes the slot
        await asyncio.wait_for(queued[0], 1)
        b.leave()
        await asyncio.wait_for(queued[1], 1)
        a.leave()
        assert table.total(IN_FLIGHT) == table.total(QUEUED) == 0

    asyncio.run(main())


def test_a_wait_past_queue_timeout_is_a_503_and_leaves_the_line(pair):
    table, admissions = pair

    async def main() -> None:
        a, b = admissions(queue_timeout=0.1)
        await a.enter()
        with pytest.raises(GatewayError) as timed_out:
            await b.enter()
        assert timed_out.value.status == 503
        assert b.queue_depth == 0 and table.get(1, 2) == NO_TICKET
        a.leave()
        assert await b.enter() == 0.0  # the line is empty: at once
        b.leave()

    asyncio.run(main())


def test_the_line_is_one_fifo_across_processes(pair):
    table, admissions = pair

    async def main() -> list[str]:
        a, b = admissions(max_in_flight=1, max_queue=5)
        order: list[str] = []

        async def wait(admission: SharedAdmission, name: str) -> None:
            await admission.enter()
            order.append(name)

        await b.enter()
        first = asyncio.create_task(wait(a, "a"))  # a's waiter draws the first ticket
        await asyncio.sleep(0.01)
        second = asyncio.create_task(wait(b, "b"))
        await asyncio.sleep(0.01)
        b.leave()  # freed in b, whose own waiter is second in line: a's goes first
        await asyncio.wait_for(first, 1)
        await asyncio.sleep(0.02)
        assert not second.done()
        a.leave()
        await asyncio.wait_for(second, 1)
        b.leave()
        return order

    assert asyncio.run(main()) == ["a", "b"]
    assert table.total(IN_FLIGHT) == 0


def test_a_cancelled_waiter_gives_back_its_place(pair):
    table, admissions = pair

    async def main() -> None:
        a, b = admissions(max_in_flight=1, max_queue=5)
        await a.enter()
        waiting = asyncio.create_task(b.enter())
        await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert table.total(QUEUED) == 0
        a.leave()
        assert table.total(IN_FLIGHT) == 0

    asyncio.run(main())
