"""A token bucket that may go into debt, on an injected clock.

Requests are paid before they run (`take`). Generated tokens are only known as they come, so
they are paid afterwards (`charge`), which may leave the bucket below zero: in debt. A caller
in debt is refused until the refill has paid it off (`debt_wait`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], float]


class TokenBucket:
    """`rate` tokens a second, holding at most `burst`; starts full."""

    def __init__(self, rate: float, burst: float, clock: Clock = time.monotonic) -> None:
        if not rate > 0 or not burst > 0:
            raise ValueError("a bucket's rate and burst must be above 0")
        self.rate, self.burst, self.clock = rate, burst, clock
        self.level = burst
        self._stamp = clock()

    def _refill(self) -> None:
        now = self.clock()
        self.level = min(self.burst, self.level + (now - self._stamp) * self.rate)
        self._stamp = now

    def wait(self, amount: float = 1.0) -> float:
        """Seconds until `amount` could be taken (0: now). Takes nothing."""
        self._refill()
        return max(0.0, (amount - self.level) / self.rate)

    def take(self, amount: float = 1.0) -> None:
        """Pay `amount` now; the caller has checked `wait` first."""
        self._refill()
        self.level -= amount

    def charge(self, amount: float) -> None:
        """Pay for what was used, even into debt."""
        self._refill()
        self.level -= amount

    def debt_wait(self) -> float:
        """Seconds until the bucket is out of debt (0: it is not in debt)."""
        self._refill()
        return max(0.0, -self.level / self.rate)

    def full(self) -> bool:
        """A full bucket behaves as a new one: it can be forgotten and made again."""
        self._refill()
        return self.level >= self.burst
