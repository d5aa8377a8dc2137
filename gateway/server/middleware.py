"""ASGI middleware: request ids, access logs and request metrics; API-key auth.

Pure ASGI (not BaseHTTPMiddleware) so that streamed responses pass through untouched and the
latency recorded is the time to the response's last byte.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import time
from collections.abc import Collection, Sequence
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import GatewayError, error_body
from gateway.observability import tracing
from gateway.observability.metrics import GatewayMetrics
from gateway.observability.request_log import bind_request_id, current_request_id, unbind_request_id
from gateway.ratelimit.callers import SCOPE_KEY as CALLER
from gateway.server.access import Surfaces
from gateway.server.admission import Admission
from gateway.server.processes.shared import SharedAdmission
from gateway.workers.pool import lease_scope

access_log = logging.getLogger("mmgate.access")


class RouteNames:
    """A request path's route as metrics and traces name it: the route's path, with its
    parameters as written in the table (`/v1/responses/{response_id}`), or "other"; never the
    path itself (ids would make a label per request)."""

    def __init__(self, routes: Collection[str]) -> None:
        self.fixed = frozenset(r for r in routes if "{" not in r)
        self.patterns = [
            (re.compile(re.sub(r"\\{[^/]+?\\}", "[^/]+", re.escape(r)) + "$"), r)
            for r in routes
            if "{" in r
        ]

    def __call__(self, path: str) -> str:
        if path in self.fixed:
            return path
        for pattern, route in self.patterns:
            if pattern.match(path):
                return route
        return "other"


class RequestMiddleware:
    """Binds the request id, echoes it in `X-Request-Id`, logs and counts every request."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics, routes: Collection[str]) -> None:
        self.app, self.metrics, self.route = app, metrics, RouteNames(routes)
        # Each metric's child per label values, looked up once: `labels()` takes a lock and
        # checks its arguments every call (~7 us each, four a request). Routes and statuses
        # are few, and a child, once made, lives as long as its metric anyway.
        self._per_route: dict[str, tuple[Any, Any]] = {}  # in flight, latency
        self._counted: dict[tuple[str, int], Any] = {}  # requests, by route and status

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token = bind_request_id(_header(scope, b"x-request-id"))
        route = self.route(scope["path"])
        status = 500
        started = time.perf_counter()
        in_flight, latency = self._route_metrics(route)
        in_flight.inc()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", current_request_id().encode()))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            elapsed = time.perf_counter() - started
            in_flight.dec()
            self._requests(route, status).inc()
            latency.observe(elapsed)
            if route != "/metrics":
                _log_access(scope, status, elapsed)
            unbind_request_id(token)

    def _route_metrics(self, route: str) -> tuple[Any, Any]:
        children = self._per_route.get(route)
        if children is None:
            metrics = self.metrics
            children = (metrics.in_flight.labels(route), metrics.latency.labels(route))
            self._per_route[route] = children
        return children

    def _requests(self, route: str, status: int) -> Any:
        counter = self._counted.get((route, status))
        if counter is None:
            counter = self.metrics.requests.labels(route, str(status))
            self._counted[(route, status)] = counter
        return counter


def _log_access(scope: Scope, status: int, elapsed: float) -> None:
    client = scope.get("client")
    access_log.info(
        "%s %s %d",
        scope["method"],
        scope["path"],
        status,
        extra={
            "status": status,
            "duration_ms": round(elapsed * 1000, 2),
            "client": f"{client[0]}:{client[1]}" if client else None,
        },
    )


class ApiKeyMiddleware:
    """`Authorization: Bearer <key>` on /v1/* (as vLLM's --api-key), /admin/* (the admin keys,
    or the API keys when there are none) and, if asked, /metrics; health, version and (as in
    vLLM) /tokenize and /detokenize stay open. /admin answers 404 when it is off (a
    non-loopback bind without an admin key, gateway.server.access).

    `x-api-key: <key>` is taken too: Anthropic's clients (its SDK, Claude Code) send the key
    there and no Authorization header. vLLM 0.32 reads only the bearer token, so they get 401
    from it unless told to send one."""

    def __init__(
        self,
        app: ASGIApp,
        keys: Collection[str],
        surfaces: Surfaces | None = None,
        callers: Sequence[str] = (),
    ) -> None:
        """`callers`: who each /v1 key is (gateway.ratelimit.callers), in `surfaces.api`'s
        order, put on the scope of a request whose key matched; none: nothing is put."""
        self.app = app
        surfaces = surfaces or Surfaces.of(list(keys), [], "open", True)
        # sha-256 first, as vLLM does: compare_digest then always compares 32 bytes, so the
        # time taken tells nothing of a key's length either
        self.api = _digests(surfaces.api)
        self.callers = list(callers)
        self.admin = None if surfaces.admin is None else _digests(surfaces.admin)
        self.metrics = _digests(surfaces.metrics)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] == "OPTIONS":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if path.startswith("/admin"):
            if self.admin is None:
                # the answer to a path that does not exist: off looks like absent
                await send_json(send, 404, {"detail": "Not Found"})
                return
            keys = self.admin
        elif path.startswith("/v1"):
            keys = self.api
        elif path == "/metrics":
            keys = self.metrics
        else:
            keys = []
        if not keys:
            await self.app(scope, receive, send)
            return
        matched = self._matched(scope, keys)
        if matched is not None:
            if keys is self.api and self.callers:
                scope[CALLER] = self.callers[matched]
            await self.app(scope, receive, send)
            return
        body = error_body("invalid or missing API key", 401)
        await send_json(send, 401, body, [(b"www-authenticate", b"Bearer")])

    def _matched(self, scope: Scope, keys: list[bytes]) -> int | None:
        """The index of the key given, or None."""
        given = (_bearer(_header(scope, b"authorization")), _header(scope, b"x-api-key"))
        # compare every key given with every key, always, so timing tells nothing about which
        # one nearly matched
        digests = [_digest(g.strip()) for g in given if g]
        matches = [any([hmac.compare_digest(d, k) for d in digests]) for k in keys]
        return matches.index(True) if sum(matches) else None


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def _digests(keys: Collection[str]) -> list[bytes]:
    return [_digest(k) for k in keys]


def _bearer(header: str | None) -> str | None:
    """The token of a bearer Authorization header (the scheme in any case, as vLLM reads it)."""
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    return token if scheme.lower() == "bearer" else None


class AdmissionMiddleware:
    """Generation routes hold an admission slot for their whole life (to the last byte of a
    stream) and count as assigned to the workers they were routed to until then."""

    def __init__(
        self,
        app: ASGIApp,
        admission: Admission | SharedAdmission,
        metrics: GatewayMetrics,
        routes: Collection[str],
    ) -> None:
        self.app, self.admission, self.metrics = app, admission, metrics
        self.routes = frozenset(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in self.routes:
            await self.app(scope, receive, send)
            return
        try:
            with tracing.span("mmgate.queue"):
                waited = await self.admission.enter()
        except GatewayError as error:
            self.metrics.rejected.labels("queue_full" if error.status == 429 else "timeout").inc()
            await send_json(send, error.status, error_body(error.message, error.status))
            return
        self.metrics.queue_wait.observe(waited)
        try:
            async with lease_scope():
                await self.app(scope, receive, send)
        finally:
            self.admission.leave()


async def send_json(
    send: Send, status: int, body: dict, headers: list[tuple[bytes, bytes]] = ()
) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return value.decode("latin-1")
    return None


class TracingMiddleware:
    """The HTTP server span of every request, continuing the client's `traceparent`."""

    def __init__(self, app: ASGIApp, routes: Collection[str]) -> None:
        self.app, self.route = app, RouteNames(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not tracing.enabled() or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        route = self.route(scope["path"])
        with tracing.server_span(scope["method"], route, headers) as server_span:

            async def send_status(message: Message) -> None:
                if message["type"] == "http.response.start":
                    server_span.set_attribute("http.response.status_code", message["status"])
                await send(message)

            await self.app(scope, receive, send_status)
