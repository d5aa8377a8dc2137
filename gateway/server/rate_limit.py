"""ASGI middleware: refuse a generation request over its caller's rate limits (the buckets
of gateway.ratelimit) with a 429.

It runs inside ApiKeyMiddleware (which names the caller whose key matched) and outside
admission: a refused request never takes or waits for a slot.
"""

from __future__ import annotations

import math
from collections.abc import Collection

from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.errors import error_body
from gateway.ratelimit import usage
from gateway.ratelimit.callers import SCOPE_KEY, client_caller
from gateway.ratelimit.limiter import RateLimiter, Refusal
from gateway.server.middleware import send_json

ERROR_TYPE = "RateLimitError"  # the openai SDK's name for a 429


def retry_after(wait: float) -> int:
    """Whole seconds, rounded up, at least 1: what the header can say (RFC 9110)."""
    return max(1, math.ceil(wait))


def refusal_body(refusal: Refusal) -> dict:
    """OpenAI's error body; it names the limit and never the caller (a key's label is the
    operator's business, the key nobody's)."""
    what = {
        "requests": f"this API key's requests ({refusal.rate:g} per second)",
        "generated_tokens": f"this API key's generated tokens ({refusal.rate:g} per second)",
        "global": f"the gateway's request rate ({refusal.rate:g} per second)",
    }[refusal.limit]
    message = f"rate limit exceeded: {what}; retry after {retry_after(refusal.wait)} s"
    return error_body(message, 429, None, ERROR_TYPE)


class RateLimitMiddleware:
    def __init__(self, app: ASGIApp, limiter: RateLimiter, routes: Collection[str]) -> None:
        self.app, self.limiter = app, limiter
        self.routes = frozenset(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in self.routes:
            await self.app(scope, receive, send)
            return
        caller = scope.get(SCOPE_KEY) or client_caller(scope)
        admitted = self.limiter.admit(caller)
        if isinstance(admitted, Refusal):
            seconds = str(retry_after(admitted.wait)).encode()
            await send_json(send, 429, refusal_body(admitted), [(b"retry-after", seconds)])
            return
        token = usage.bind(admitted)
        try:
            await self.app(scope, receive, send)
        finally:
            usage.unbind(token)
            self.limiter.done(admitted)
