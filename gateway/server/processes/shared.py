"""Admission slots and readiness shared by the gateway's processes (`--api-server-count`).

One small array of 64-bit integers in shared memory, guarded by one cross-process lock, holds
per process its admitted requests, its queued requests, the ticket of its first waiter and
whether it is ready. Per process, so the supervisor can give a dead child's slots back
(`ProcessTable.reclaim`). `--max-in-flight` and `--max-queue` bound the sums: the whole
gateway. Waiters wait in their own process's event loop, in one global FIFO order: every
queued request draws a ticket, and a process grants its first waiter a free slot only when
that waiter holds the smallest ticket of all. A slot freed in the waiter's own process is
granted at once; one freed in another process is seen by a short poll (`POLL_SECONDS`),
which runs only while the process has waiters.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterator
from multiprocessing.context import SpawnContext

from gateway.observability.metrics import GaugesFrom
from gateway.server.admission import admission_gauges, at_capacity, wait_in_line

IN_FLIGHT, QUEUED, HEAD, READY = range(4)
FIELDS = 4
NEXT_TICKET, NEXT_TURN = -2, -1  # after every process's fields
NO_TICKET = 1 << 62
POLL_SECONDS = 0.002
LOCK_TIMEOUT = 2.0  # nothing holds the lock this long but a process that died holding it


class ProcessTable:
    """The shared array and its lock; made by the supervisor, handed to each child (both
    pickle across `spawn`)."""

    def __init__(self, ctx: SpawnContext, count: int) -> None:
        self.count = count
        self.values = ctx.RawArray("q", count * FIELDS + 2)  # + the next ticket and turn
        self.lock = ctx.Lock()
        for index in range(count):
            self.values[index * FIELDS + HEAD] = NO_TICKET

    def get(self, index: int, field: int) -> int:
        return self.values[index * FIELDS + field]

    def total(self, field: int) -> int:
        v = self.values
        return sum(v[i * FIELDS + field] for i in range(self.count))

    def set_ready(self, index: int, ready: bool) -> None:
        self.values[index * FIELDS + READY] = int(ready)

    def all_ready(self) -> bool:
        return self.total(READY) == self.count

    def turns(self) -> Iterator[int]:
        """The gateway's round-robin turns, one counter for every process."""
        while True:
            with self.lock:
                turn = self.values[NEXT_TURN]
                self.values[NEXT_TURN] = turn + 1
            yield turn

    def reclaim(self, index: int) -> None:
        """A dead child's slots and waiters, given back (by the supervisor). A child killed
        inside the lock leaves it taken: after LOCK_TIMEOUT the supervisor takes it as its
        own (a Lock may be released by any process) and frees it when done."""
        self.lock.acquire(timeout=LOCK_TIMEOUT)
        try:
            base = index * FIELDS
            self.values[base + IN_FLIGHT] = 0
            self.values[base + QUEUED] = 0
            self.values[base + HEAD] = NO_TICKET
            self.values[base + READY] = 0
        finally:
            self.lock.release()


class SharedAdmission:
    """gateway.server.admission.Admission's interface over a ProcessTable: this process's
    side of the gateway-wide bound."""

    def __init__(
        self,
        table: ProcessTable,
        index: int,
        max_in_flight: int,
        max_queue: int,
        queue_timeout: float,
    ) -> None:
        if max_in_flight < 1 or max_queue < 0:
            raise ValueError("max_in_flight must be >= 1 and max_queue >= 0")
        self.table, self.index = table, index
        self.max_in_flight, self.max_queue = max_in_flight, max_queue
        self.queue_timeout = queue_timeout
        self._base = index * FIELDS
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._poller: asyncio.Task | None = None

    @property
    def in_flight(self) -> int:
        """Admitted requests of the whole gateway."""
        return self.table.total(IN_FLIGHT)

    @property
    def queue_depth(self) -> int:
        """Waiting requests of the whole gateway."""
        return self.table.total(QUEUED)

    async def enter(self) -> float:
        """Take a slot (seconds waited), or raise GatewayError 429/503."""
        t, v = self.table, self.table.values
        with t.lock:
            queued = t.total(QUEUED)
            if queued == 0 and t.total(IN_FLIGHT) < self.max_in_flight:
                v[self._base + IN_FLIGHT] += 1
                return 0.0
            if queued >= self.max_queue:
                raise at_capacity(self.max_in_flight, self.max_queue)
            ticket = v[NEXT_TICKET]
            v[NEXT_TICKET] = ticket + 1
            v[self._base + QUEUED] += 1
            if not self._waiters:
                v[self._base + HEAD] = ticket
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append((ticket, waiter))
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll())
        return await wait_in_line(waiter, self.queue_timeout, self.leave, self._withdraw)

    def _withdraw(self, waiter: asyncio.Future[None]) -> None:
        with self.table.lock:
            for entry in self._waiters:
                if entry[1] is waiter:
                    self._waiters.remove(entry)
                    break
            v = self.table.values
            v[self._base + QUEUED] -= 1
            v[self._base + HEAD] = self._waiters[0][0] if self._waiters else NO_TICKET

    def leave(self) -> None:
        """Free a slot: granted at once to this process's first waiter if it is first in
        line; else another process's poll takes it."""
        with self.table.lock:
            self.table.values[self._base + IN_FLIGHT] -= 1
            self._grant()

    def _grant(self) -> None:
        """Under the lock: slots to this process's waiters while there are free slots and
        its first waiter holds the gateway's smallest ticket."""
        t, v = self.table, self.table.values
        while self._waiters and t.total(IN_FLIGHT) < self.max_in_flight:
            heads = (v[i * FIELDS + HEAD] for i in range(t.count))
            if self._waiters[0][0] != min(heads):
                return
            _, waiter = self._waiters.popleft()
            v[self._base + IN_FLIGHT] += 1
            v[self._base + QUEUED] -= 1
            v[self._base + HEAD] = self._waiters[0][0] if self._waiters else NO_TICKET
            waiter.set_result(None)

    async def _poll(self) -> None:
        while self._waiters:
            await asyncio.sleep(POLL_SECONDS)
            with self.table.lock:
                self._grant()

    def collector(self) -> GaugesFrom:
        """The gateway-wide queue depth and admitted requests, read once by whichever
        process is scraped (not summed over processes)."""
        return admission_gauges(self)


def make_context() -> SpawnContext:
    import multiprocessing

    return multiprocessing.get_context("spawn")
