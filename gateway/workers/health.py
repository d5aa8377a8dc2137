"""Whether a worker gets traffic: health checks with hysteresis, and a circuit breaker on calls.

Health: a worker leaves after `fall` consecutive failed checks and returns after `rise`
consecutive passes. Circuit: `failures` consecutive failed calls open it (no traffic) for
`cooldown` seconds; then it is half-open (traffic again), and the next call's result closes or
re-opens it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class HealthGate:
    fall: int = 3
    rise: int = 2
    healthy: bool = False
    _streak: int = 0  # consecutive results contrary to the current state

    def record(self, passed: bool) -> bool:
        """Feed one check; returns True when the state flipped."""
        if passed == self.healthy:
            self._streak = 0
            return False
        self._streak += 1
        if self._streak >= (self.rise if passed else self.fall):
            self.healthy, self._streak = passed, 0
            return True
        return False

    def force(self, healthy: bool) -> None:
        self.healthy, self._streak = healthy, 0


CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"
STATE_VALUES = {CLOSED: 0.0, HALF_OPEN: 1.0, OPEN: 2.0}


@dataclass
class CircuitBreaker:
    failures: int = 5
    cooldown: float = 30.0
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    _state: str = CLOSED
    _consecutive: int = 0
    _opened_at: float = 0.0

    @property
    def state(self) -> str:
        if self._state == OPEN and self.clock() - self._opened_at >= self.cooldown:
            self._state = HALF_OPEN
        return self._state

    def allows(self) -> bool:
        return self.state != OPEN

    def record(self, ok: bool) -> None:
        if ok:
            self._state, self._consecutive = CLOSED, 0
            return
        self._consecutive += 1
        if self.state == HALF_OPEN or self._consecutive >= self.failures:
            self._state, self._opened_at = OPEN, self.clock()
