"""HotRoutes on its own: what reaches the handler, what the client gets when it fails.
(The real routes run through it in every gateway test.)"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from starlette.datastructures import State
from starlette.responses import PlainTextResponse

from gateway.errors import GatewayError
from gateway.server.hot_routes import HotRoutes, parse_json


async def fallback(scope, receive, send) -> None:
    await PlainTextResponse("fallback")(scope, receive, send)


async def echo(state: State, body: object) -> dict:
    if body == "boom":
        raise RuntimeError("a bug")
    if body == "bad":
        raise GatewayError("bad input", 400, "messages")
    return {"got": body, "state": state.name}


def requests(check) -> None:
    """Runs `check(client)` against HotRoutes with one route, /v1/x -> echo."""
    state = State()
    state.name = "s"
    app = HotRoutes(fallback, {"/v1/x": echo}, state)

    async def run() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            await check(client)

    asyncio.run(run())


def test_body_and_state_reach_the_handler():
    async def check(client: httpx.AsyncClient) -> None:
        reply = await client.post("/v1/x", json={"a": [1, "é"]})
        assert reply.status_code == 200
        assert reply.json() == {"got": {"a": [1, "é"]}, "state": "s"}
        assert (await client.get("/other")).text == "fallback"

    requests(check)


def test_failures_are_openai_shaped():
    async def check(client: httpx.AsyncClient) -> None:
        reply = await client.post("/v1/x", json="bad")
        assert reply.status_code == 400 and reply.json()["error"]["param"] == "messages"
        reply = await client.post("/v1/x", json="boom")
        assert reply.status_code == 500
        assert reply.json()["error"] == {
            "message": "internal server error",
            "type": "InternalServerError",
            "param": None,
            "code": 500,
        }
        reply = await client.post("/v1/x", content=b"\xff")
        assert reply.status_code == 400 and "not valid JSON" in reply.json()["error"]["message"]
        reply = await client.get("/v1/x")
        assert reply.status_code == 405 and reply.headers["allow"] == "POST"

    requests(check)


BODIES = [
    '{"messages": [{"role": "user", "content": "é ✓ 😀 \\u00e9 \\ud83d\\ude00"}], "n": 1}',
    '{"a": 1, "a": 2, "big": 123456789012345678901234567890, "f": [0.1, 1e400, -0.0, 1E-7]}',
    '{"s": "\\ud800", "t": "\\"\\\\\\/\\b\\f\\n\\r\\t"}',  # a lone surrogate escape
    " [ ] ",
]


def test_bodies_read_as_json_loads_reads_them():
    for text in BODIES:
        for raw in (text.encode(), text.encode("utf-8-sig"), text.encode("utf-16")):
            assert parse_json(raw) == json.loads(raw), raw
    for raw in (b"", b"[1] x", b"\xff", b"{'a': 1}", b"tru"):
        with pytest.raises(GatewayError):
            parse_json(raw)


def test_nan_and_infinity_are_not_json():
    for raw in (b'{"t": NaN}', b'{"t": Infinity}', b"[-Infinity]", b"\xef\xbb\xbf[NaN]"):
        with pytest.raises(GatewayError, match="is not a number"):
            parse_json(raw)
