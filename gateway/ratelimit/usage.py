"""The generated tokens of the request being served, charged to its caller as they come.

A context variable, so the generation code (gateway.stream) charges whoever the rate-limit
middleware admitted without either knowing the other: unset (no limiter, or a route that is
not limited) charging costs one lookup. Tasks a request starts (a streamed response's reader,
a background Responses run) copy the context, so their tokens are charged too.
"""

from __future__ import annotations

from contextvars import ContextVar, Token
from typing import Protocol


class Meter(Protocol):
    def charge(self, tokens: int) -> None: ...


_meter: ContextVar[Meter | None] = ContextVar("mmgate_rate_meter", default=None)


def charge_generated(tokens: int) -> None:
    meter = _meter.get()
    if meter is not None and tokens:
        meter.charge(tokens)


def bind(meter: Meter) -> Token:
    return _meter.set(meter)


def unbind(token: Token) -> None:
    _meter.reset(token)
