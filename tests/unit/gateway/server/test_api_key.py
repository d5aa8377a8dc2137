"""--api-key: the key as a bearer token (as vLLM reads it, the scheme in any case) or as
`x-api-key` (Anthropic's clients send it there; vLLM 0.32 does not read it)."""

from __future__ import annotations

import pytest
from starlette.responses import PlainTextResponse
from starlette.testclient import TestClient

from gateway.server.middleware import ApiKeyMiddleware


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(ApiKeyMiddleware(PlainTextResponse("ok"), ["k1", "secret"]))


@pytest.mark.parametrize(
    "headers",
    [
        {"Authorization": "Bearer secret"},
        {"Authorization": "bearer k1"},
        {"x-api-key": "secret"},
        {"x-api-key": "wrong", "Authorization": "Bearer k1"},
        {"x-api-key": "k1", "Authorization": "Basic abc"},
    ],
)
def test_a_right_key_in_either_header_passes(client, headers):
    assert client.post("/v1/messages", headers=headers).status_code == 200


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": "secret"},
        {"Authorization": "Basic secret"},
        {"x-api-key": "wrong"},
        {"x-api-key": ""},
        {"x-api-key": "secre"},
    ],
)
def test_no_right_key_is_a_401(client, headers):
    refused = client.post("/v1/messages", headers=headers)
    assert refused.status_code == 401
    assert refused.json()["error"]["message"] == "invalid or missing API key"


def test_open_paths_need_no_key(client):
    assert client.get("/health").status_code == 200
