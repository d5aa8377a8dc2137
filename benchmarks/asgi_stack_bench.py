"""What the ASGI stack costs a generation request: a FastAPI route vs `HotRoutes`.

    python -m benchmarks.asgi_stack_bench [--requests 20000] [--rounds 3]

Both stacks carry the gateway's own middleware (request ids, access log, metrics, admission),
the access log going to /dev/null in the gateway's text format, and a FastAPI app with a dozen
other routes. The handler returns a small JSONResponse at once, so what is measured is the
stack: parsing the body, routing, the middleware, sending the response. Requests are ASGI calls
in one process on uvloop (no sockets), alternating between the two stacks round by round.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

import uvloop
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message

from gateway.observability.metrics import GatewayMetrics
from gateway.observability.request_log import configure_logging
from gateway.server.admission import Admission
from gateway.server.hot_routes import HotRoutes, parse_json
from gateway.server.middleware import AdmissionMiddleware, RequestMiddleware

ROUTE = "/v1/chat/completions"
BODY = json.dumps({"messages": [{"role": "user", "content": "Hi."}], "max_tokens": 16}).encode()
SCOPE = {
    "type": "http",
    "asgi": {"version": "3.0", "spec_version": "2.4"},
    "http_version": "1.1",
    "method": "POST",
    "scheme": "http",
    "path": ROUTE,
    "raw_path": ROUTE.encode(),
    "query_string": b"",
    "root_path": "",
    "headers": [(b"host", b"bench"), (b"content-type", b"application/json")],
    "client": ("127.0.0.1", 1),
    "server": ("127.0.0.1", 2),
}


class Service:
    async def create(self, body: object) -> JSONResponse:
        return JSONResponse({"id": "x", "object": "chat.completion"})


def fastapi_app() -> FastAPI:
    app = FastAPI()
    app.state.chat = Service()
    for i in range(12):
        app.get(f"/other/{i}")(lambda: {})

    @app.post(ROUTE)
    async def chat(request: Request):
        return await request.app.state.chat.create(parse_json(await request.body()))

    return app


def with_middleware(app: ASGIApp, metrics: GatewayMetrics) -> ASGIApp:
    admitted = AdmissionMiddleware(app, Admission(256, 1024, 30), metrics, [ROUTE])
    return RequestMiddleware(admitted, metrics, {ROUTE})


def stacks() -> dict[str, ASGIApp]:
    metrics = GatewayMetrics()
    plain = fastapi_app()
    hot = fastapi_app()
    handlers = {ROUTE: lambda state, body: state.chat.create(body)}
    return {
        "FastAPI route": with_middleware(plain, metrics),
        "HotRoutes": with_middleware(HotRoutes(hot, handlers, hot.state), metrics),
    }


async def per_request_us(app: ASGIApp, requests: int) -> float:
    async def receive() -> Message:
        return {"type": "http.request", "body": BODY, "more_body": False}

    async def send(message: Message) -> None:
        pass

    for _ in range(requests // 10):  # warm-up
        await app(dict(SCOPE), receive, send)
    start = time.perf_counter()
    for _ in range(requests):
        await app(dict(SCOPE), receive, send)
    return (time.perf_counter() - start) / requests * 1e6


async def run(requests: int, rounds: int) -> None:
    apps = stacks()
    results: dict[str, list[float]] = {name: [] for name in apps}
    for _ in range(rounds):
        for name, app in apps.items():
            results[name].append(await per_request_us(app, requests))
    print("| stack | us per request (median of rounds) | all rounds |")
    print("|---|---|---|")
    medians = {}
    for name, values in results.items():
        medians[name] = sorted(values)[len(values) // 2]
        rounds_text = ", ".join(f"{v:.1f}" for v in values)
        print(f"| {name} | {medians[name]:.1f} | {rounds_text} |")
    print(f"\nFastAPI route / HotRoutes: {medians['FastAPI route'] / medians['HotRoutes']:.2f}x")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.asgi_stack_bench", description=__doc__)
    p.add_argument("--requests", type=int, default=20000)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    configure_logging()
    logging.getLogger().handlers[0].setStream(open("/dev/null", "w"))  # noqa: SIM115
    uvloop.run(run(args.requests, args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
