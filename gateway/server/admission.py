"""A bound on the generation requests the gateway works on at once, with a bounded FIFO queue.

Beyond `max_in_flight`, requests wait in line; a full line is refused at once with 429, and a
request that waited `queue_timeout` seconds gets 503. Memory stays bounded by both numbers.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

from gateway.errors import GatewayError
from gateway.observability.metrics import GaugesFrom


def at_capacity(max_in_flight: int, max_queue: int) -> GatewayError:
    """The 429 for a request that finds the line full."""
    return GatewayError(
        f"the gateway is at capacity ({max_in_flight} requests in flight, "
        f"{max_queue} queued); retry later",
        429,
    )


def waited_too_long(queue_timeout: float) -> GatewayError:
    """The 503 for a request that waited its whole --queue-timeout."""
    return GatewayError(f"no capacity within {queue_timeout:g} s; retry later", 503)


async def wait_in_line(
    waiter: asyncio.Future[None],
    queue_timeout: float,
    leave: Callable[[], None],
    withdraw: Callable[[asyncio.Future[None]], None],
) -> float:
    """Wait for `waiter` (a slot handed over) at most `queue_timeout` s; the seconds waited.
    Given up (timeout: 503, or cancelled), a slot that arrived meanwhile is passed on with
    `leave`, else the waiter leaves the line with `withdraw`."""
    started = time.perf_counter()
    try:
        await asyncio.wait_for(asyncio.shield(waiter), queue_timeout)
    except (TimeoutError, asyncio.CancelledError) as error:
        if waiter.done() and not waiter.cancelled():
            leave()  # the slot arrived as we gave up: pass it on
        else:
            waiter.cancel()
            withdraw(waiter)
        if isinstance(error, asyncio.CancelledError):
            raise
        raise waited_too_long(queue_timeout) from None
    return time.perf_counter() - started


class AdmissionState(Protocol):
    @property
    def queue_depth(self) -> int: ...

    @property
    def in_flight(self) -> int: ...


def admission_gauges(admission: AdmissionState) -> GaugesFrom:
    """Queue depth and admitted requests for /metrics, read at scrape time."""
    return GaugesFrom(
        [
            ("mmgate_queue_depth", "generation requests waiting for admission", []),
            ("mmgate_admitted_requests", "generation requests admitted and running", []),
        ],
        lambda: {
            "mmgate_queue_depth": [([], float(admission.queue_depth))],
            "mmgate_admitted_requests": [([], float(admission.in_flight))],
        },
    )


class Admission:
    def __init__(self, max_in_flight: int, max_queue: int, queue_timeout: float) -> None:
        if max_in_flight < 1 or max_queue < 0:
            raise ValueError("max_in_flight must be >= 1 and max_queue >= 0")
        self.max_in_flight, self.max_queue = max_in_flight, max_queue
        self.queue_timeout = queue_timeout
        self.in_flight = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def queue_depth(self) -> int:
        return len(self._waiters)

    async def enter(self) -> float:
        """Take a slot (seconds waited), or raise GatewayError 429/503."""
        if self.in_flight < self.max_in_flight and not self._waiters:
            self.in_flight += 1
            return 0.0
        if len(self._waiters) >= self.max_queue:
            raise at_capacity(self.max_in_flight, self.max_queue)
        return await self._wait()

    async def _wait(self) -> float:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        return await wait_in_line(waiter, self.queue_timeout, self.leave, self._waiters.remove)

    def collector(self) -> GaugesFrom:
        """Queue depth and admitted requests for /metrics, read at scrape time."""
        return admission_gauges(self)

    def leave(self) -> None:
        """Free a slot: handed straight to the first waiter, if any."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # in_flight unchanged: the slot changes hands
                return
        self.in_flight -= 1
