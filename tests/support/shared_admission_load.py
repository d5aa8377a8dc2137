"""Processes for tests/unit/gateway/server/processes/test_shared_admission.py: spawned
children import this module (light: no pytest) to load a shared admission table."""

from __future__ import annotations

import asyncio
import random

from gateway.server.processes.shared import IN_FLIGHT, ProcessTable, SharedAdmission

MAX_IN_FLIGHT = 3


def hammer(table: ProcessTable, index: int, requests: int, results) -> None:  # noqa: ANN001
    """Send `requests` at once through process `index`'s admission; report the most slots
    ever seen taken gateway-wide while holding one, and how many were served."""

    async def one(admission: SharedAdmission, seen: list[int]) -> None:
        await admission.enter()
        try:
            seen.append(table.total(IN_FLIGHT))
            await asyncio.sleep(random.uniform(0, 0.004))
            seen.append(table.total(IN_FLIGHT))
        finally:
            admission.leave()

    async def main() -> tuple[int, int]:
        admission = SharedAdmission(table, index, MAX_IN_FLIGHT, 10_000, 60)
        seen: list[int] = []
        await asyncio.gather(*(one(admission, seen) for _ in range(requests)))
        return max(seen), len(seen) // 2

    results.put((index, *asyncio.run(main())))


def hold(table: ProcessTable, index: int, slots: int, held) -> None:  # noqa: ANN001
    """Take `slots` slots as process `index`, say so, and keep them until killed."""

    async def main() -> None:
        admission = SharedAdmission(table, index, MAX_IN_FLIGHT, 10, 60)
        for _ in range(slots):
            await admission.enter()
        held.set()
        await asyncio.sleep(3600)

    asyncio.run(main())
