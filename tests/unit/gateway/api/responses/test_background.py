"""Background runs hold one of the gateway's admission slots while they run: they outlive
their requests' slots, and would otherwise escape the bound on generations."""

from __future__ import annotations

import asyncio

from gateway.api.responses.background import BackgroundRuns
from gateway.server.admission import Admission


def test_a_run_waits_for_a_slot_and_frees_it_when_done():
    async def go() -> list[str]:
        admission = Admission(max_in_flight=1, max_queue=4, queue_timeout=10)
        runs, seen = BackgroundRuns(admission), []
        await admission.enter()  # a request holds the only slot

        async def run() -> None:
            seen.append(f"running with {admission.in_flight} in flight")

        runs.start("resp_1", run())
        await asyncio.sleep(0.05)
        seen.append(f"waiting: {admission.queue_depth} queued")
        admission.leave()  # the request ends
        while runs.running("resp_1"):
            await asyncio.sleep(0.01)
        seen.append(f"done: {admission.in_flight} in flight")
        return seen

    assert asyncio.run(go()) == [
        "waiting: 1 queued",
        "running with 1 in flight",
        "done: 0 in flight",
    ]


def test_a_run_cancelled_while_it_waits_never_starts_and_takes_no_slot():
    async def go() -> tuple[bool, int, int]:
        admission = Admission(max_in_flight=1, max_queue=4, queue_timeout=10)
        runs, started = BackgroundRuns(admission), []
        await admission.enter()

        async def run() -> None:
            started.append(True)

        runs.start("resp_1", run())
        await asyncio.sleep(0.05)
        cancelled = await runs.cancel("resp_1")
        admission.leave()
        return cancelled and not started, admission.in_flight, admission.queue_depth

    assert asyncio.run(go()) == (True, 0, 0)
