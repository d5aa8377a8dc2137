"""Request limits at the gateway's edge: each past its limit is a 400 (413 for the body)
naming the limit and its flag, before any handler runs; at the limit it passes."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from starlette.datastructures import State

from gateway.errors import GatewayError
from gateway.server.hot_routes import HotRoutes, parse_json
from gateway.server.limits import RequestLimits, json_depth

LIMITS = RequestLimits(
    max_body_bytes=1000,
    max_json_depth=8,
    max_messages=3,
    max_content_parts=2,
    max_images=2,
    max_stop_strings=2,
)


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(
    ("value", "depth"),
    [(1, 0), ([], 1), ({}, 1), ({"a": [1, {"b": []}]}, 4), (json.loads(nested(50)), 50)],
)
def test_json_depth(value, depth):
    assert json_depth(value, 100) == depth


def test_depth_is_counted_no_further_than_one_past_the_cap():
    assert json_depth(json.loads(nested(150)), 10) == 11


def test_parse_json_refuses_deep_bodies_whoever_parses_them():
    assert parse_json(nested(8).encode(), LIMITS) == json.loads(nested(8))
    for depth in (9, 150, 100_000):  # ours; past jiter's own limit; past Python's stack
        with pytest.raises(GatewayError, match=r"deeper than 8 levels \(--max-json-depth\)"):
            parse_json(nested(depth).encode(), LIMITS)
    # the json.loads fallback (a BOM) is held to it too
    with pytest.raises(GatewayError, match="--max-json-depth"):
        parse_json(nested(100_000).encode("utf-8-sig"), LIMITS)


def chat(messages=None, stop=None) -> dict:
    body = {"messages": messages or [{"role": "user", "content": "hi"}]}
    return body if stop is None else {**body, "stop": stop}


IMAGE = {"type": "image_url", "image_url": {"url": "data:,"}}
TEXT = {"type": "text", "text": "x"}
REFUSED = [
    (chat([{"role": "user", "content": "hi"}] * 4), "4 messages; at most 3", "--max-messages"),
    (chat([{"role": "user", "content": [TEXT] * 3}]), "3 content parts", "--max-content-parts"),
    (
        chat([{"role": "user", "content": [IMAGE, IMAGE]}, {"role": "user", "content": [IMAGE]}]),
        "3 images; at most 2",
        "--max-images-per-request",
    ),
    (chat(stop=["a", "b", "c"]), "3 stop strings", "--max-stop-strings"),
]


@pytest.mark.parametrize(("body", "says", "flag"), REFUSED)
def test_counted_limits(body, says, flag):
    with pytest.raises(GatewayError) as refused:
        LIMITS.check_body(body)
    assert refused.value.status == 400
    assert says in refused.value.message and flag in refused.value.message


def test_at_the_limits_a_body_passes():
    two_images = [{"role": "user", "content": [IMAGE, TEXT]}] * 2
    LIMITS.check_body(chat([*two_images, {"role": "user", "content": [TEXT]}], stop=["a", "b"]))
    LIMITS.check_body(["not", "an", "object"])  # validated (and refused) by the route itself


async def handler(state: State, body: object) -> dict:
    return {"got": body}


def post(content: bytes, headers: dict | None = None) -> httpx.Response:
    app = HotRoutes(handler, {"/v1/x": handler}, State(), LIMITS)

    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.post("/v1/x", content=content, headers=headers or {})

    return asyncio.run(run())


def test_hot_routes_apply_the_limits():
    assert post(json.dumps(chat()).encode()).status_code == 200
    reply = post(b'{"pad": "' + b"x" * 1000 + b'"}')
    assert reply.status_code == 413
    assert "larger than 1000 bytes (--max-request-body-bytes)" in reply.json()["error"]["message"]
    reply = post(nested(9).encode())
    assert reply.status_code == 400 and "--max-json-depth" in reply.json()["error"]["message"]
    reply = post(json.dumps(chat(stop=["a", "b", "c"])).encode())
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "stop"


def test_a_declared_length_past_the_limit_is_refused_before_the_body_is_read():
    async def run() -> tuple[int, int]:
        sent = []

        async def receive():
            raise AssertionError("the body was read")

        async def send(message):
            sent.append(message)

        scope = {
            "type": "http",
            "method": "POST",
            "path": "/v1/x",
            "headers": [(b"content-length", b"5000")],
        }
        await HotRoutes(handler, {"/v1/x": handler}, State(), LIMITS)(scope, receive, send)
        return sent[0]["status"], len(sent)

    assert asyncio.run(run())[0] == 413
