"""Bad input is a 4xx: every route of the gateway's own OpenAPI document fuzzed with
schemathesis (bodies that fit the schema and bodies that do not), against the real gateway in
front of a real worker. No answer is a 5xx, none hangs, and the gateway still serves after.
Then the malformed requests once seen to give a 500, or to be taken when OpenAI or vLLM refuse
them, each with its status and message.

Bounded in time: a fixed number of examples per route and mode (`MMGATE_FUZZ_EXAMPLES`,
default 15), derandomized so CI runs the same cases; a worker with a short context keeps
generations short. Raise the count locally to search further.
"""

from __future__ import annotations

import json
import os

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings

from gateway.server.routes import ROUTES as TABLE
from tests.support.engines import serve_worker
from tests.support.gateway_process import GatewayProcess

EXAMPLES = int(os.environ.get("MMGATE_FUZZ_EXAMPLES", "15"))
TIMEOUT = 60.0  # seconds an answer may take: past it, the route hangs


def _takes_invalid_input(route) -> bool:
    """A body or query parameters can be made invalid; a path parameter alone (an id) is any
    string, so nothing about it is invalid."""
    if route.body is not None:
        return True
    fields = route.params.model_fields if route.params is not None else {}
    return any("{" + name + "}" not in route.path for name in fields)


# Every operation of the route table, and whether it takes input that can be made invalid:
# /openapi.json must document exactly these (the test below), all fuzzed.
ROUTES = [(route.method, route.path, _takes_invalid_input(route)) for route in TABLE]
FUZZED = [(method, path, "positive") for method, path, _ in ROUTES] + [
    (method, path, "negative") for method, path, takes_input in ROUTES if takes_input
]


@pytest.fixture(scope="module")
def worker(text_model, tmp_path_factory):
    # 256 tokens of context: whatever max_tokens a case asks for, a generation stays short.
    yield from serve_worker(text_model, tmp_path_factory, "fuzz-worker", max_model_len=256)


@pytest.fixture(scope="module")
def gateway(text_model, worker, tmp_path_factory):
    logs = tmp_path_factory.mktemp("fuzz")
    gateway = GatewayProcess(text_model, [worker.address], logs / "gateway.log")
    yield gateway.wait_ready()
    gateway.stop()


@pytest.fixture(scope="module")
def schema(gateway):
    import schemathesis

    return schemathesis.openapi.from_url(gateway.base_url + "/openapi.json")


def test_every_route_is_fuzzed(schema):
    documented = {
        (method.upper(), path) for path, operations in schema.items() for method in operations
    }
    assert documented == {(method, path) for method, path, _ in ROUTES}


@pytest.mark.parametrize(("method", "path", "mode"), FUZZED)
def test_no_route_answers_5xx_or_hangs(schema, gateway, method, path, mode):
    from schemathesis import GenerationMode
    from schemathesis.checks import not_a_server_error

    operation = schema[path][method]
    strategy = operation.as_strategy(generation_mode=GenerationMode(mode))

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def fuzz(case):
        response = case.call(base_url=gateway.base_url, timeout=TIMEOUT)
        case.validate_response(response, checks=[not_a_server_error])

    fuzz()
    # still serving
    assert httpx.get(gateway.base_url + "/ready", timeout=10).status_code == 200


def post(gateway: GatewayProcess, path: str, body: object) -> httpx.Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"content-type": "application/json"}
    return httpx.post(gateway.base_url + path, content=data, headers=headers, timeout=TIMEOUT)


HI = [{"role": "user", "content": "hi"}]
DEEP = b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
# (route, body, status, words of the message, param)
CASES = [
    ("/v1/chat/completions", DEEP, 400, "nested deeper than 64 levels", None),
    (
        "/v1/chat/completions",
        {"messages": HI, "logit_bias": {"x": 1}},
        400,
        "cannot be converted to integer token IDs",
        "logit_bias",
    ),
    (
        "/v1/chat/completions",
        {"messages": HI, "logit_bias": {str(2**40): 1}},
        400,
        "out-of-vocab token ids",
        "logit_bias",
    ),
    ("/v1/completions", {"prompt": [1, -5, 3]}, 400, "Token id -5 is out of vocabulary", "prompt"),
    ("/v1/completions", {"prompt": [1, 10**9]}, 400, "Token id 1000000000 is out of", "prompt"),
    (
        "/v1/chat/completions",
        {"messages": HI, "max_tokens": 10**8},
        400,
        "max_tokens=100000000 cannot be greater than max_model_len=256",
        "max_tokens",
    ),
    (
        "/v1/completions",
        {"prompt": "hi", "max_tokens": 257},
        400,
        "max_tokens=257 cannot be greater than max_model_len=256",
        "max_tokens",
    ),
    ("/v1/chat/completions", {"messages": HI, "stream": "yes"}, 400, "valid boolean", "stream"),
    (
        "/v1/chat/completions",
        {"messages": HI * 5000},
        400,
        "5000 messages; at most 4096 are accepted (--max-messages)",
        "messages",
    ),
    (
        "/v1/chat/completions",
        {"messages": HI, "stop": ["x"] * 65},
        400,
        "(--max-stop-strings)",
        "stop",
    ),
    ("/tokenize", DEEP, 400, "nested deeper", None),
    ("/v1/chat/completions", b"x" * (64 * 2**20 + 1), 413, "(--max-request-body-bytes)", None),
]


@pytest.mark.parametrize(("path", "body", "status", "says", "param"), CASES)
def test_known_bad_requests_are_refused_by_name(gateway, path, body, status, says, param):
    reply = post(gateway, path, body)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert says in error["message"]
    assert error["param"] == param
