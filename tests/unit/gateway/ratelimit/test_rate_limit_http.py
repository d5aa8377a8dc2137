"""The rate limits over HTTP (behind ApiKeyMiddleware, as the app stacks them): the 429, its
Retry-After and OpenAI body, which caller each key is, per-caller metrics; and never a key in
a body, a header, a metric or a log line."""

from __future__ import annotations

import logging

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.responses import JSONResponse
from starlette.testclient import TestClient

from gateway.observability.metrics import GatewayMetrics
from gateway.ratelimit import usage
from gateway.ratelimit.callers import key_callers, key_hash
from gateway.ratelimit.limiter import RateLimiter
from gateway.ratelimit.policy import Limit, Policy, RateLimits
from gateway.server.access import Surfaces
from gateway.server.middleware import ApiKeyMiddleware, RequestMiddleware
from gateway.server.rate_limit import RateLimitMiddleware, refusal_body, retry_after

RED, BLUE, PLAIN = "sk-red:with:colons-1", "sk-blue-2", "sk-plain-3"
LABELS = {RED: "team-red", BLUE: "team-blue"}
ROUTE = "/v1/chat/completions"


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


async def generating_app(scope, receive, send) -> None:
    """A generation route stand-in: charges the tokens its body asks for, as the generation
    code does while a stream comes."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    usage.charge_generated(int(body or b"0"))
    await JSONResponse({"ok": True})(scope, receive, send)


def _gateway(limits: RateLimits, keys=(RED, BLUE, PLAIN)):
    clock, metrics = Clock(), GatewayMetrics()
    limiter = RateLimiter(limits, clock, metrics)
    stack = RateLimitMiddleware(generating_app, limiter, {ROUTE})
    surfaces = Surfaces.of(list(keys), [], "open", True)
    stack = ApiKeyMiddleware(stack, keys, surfaces, key_callers(list(keys), LABELS))
    client = TestClient(RequestMiddleware(stack, metrics, {ROUTE, "/v1/models"}))
    return client, clock, metrics


def _post(client, key: str | None, tokens: int = 0):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return client.post(ROUTE, content=str(tokens), headers=headers)


def test_retry_after_is_whole_seconds_rounded_up_at_least_one():
    assert [retry_after(w) for w in (0.0, 0.001, 0.999, 1.0, 1.01, 59.5)] == [1, 1, 1, 1, 2, 60]


def test_over_its_limit_a_key_gets_a_429_with_retry_after_and_an_openai_body():
    client, clock, _ = _gateway(RateLimits(default=Policy(requests=Limit(0.5, 2))))
    assert [_post(client, RED).status_code for _ in range(2)] == [200, 200]
    refused = _post(client, RED)
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "2"  # one request at 0.5 a second
    assert refused.headers["content-type"] == "application/json"
    assert refused.json() == {
        "error": {
            "message": "rate limit exceeded: this API key's requests (0.5 per second); "
            "retry after 2 s",
            "type": "RateLimitError",
            "param": None,
            "code": 429,
        }
    }
    assert _post(client, BLUE).status_code == 200  # another key, its own bucket
    clock.now += 2
    assert _post(client, RED).status_code == 200


def test_generated_tokens_put_a_key_in_debt_and_retry_after_is_the_time_to_pay_it():
    client, clock, _ = _gateway(RateLimits(default=Policy(generated_tokens=Limit(10, 20))))
    assert _post(client, RED, tokens=45).status_code == 200  # 25 in debt, 10 a second
    refused = _post(client, RED)
    assert refused.status_code == 429 and refused.headers["retry-after"] == "3"
    assert "generated tokens (10 per second)" in refused.json()["error"]["message"]
    assert _post(client, BLUE, tokens=5).status_code == 200
    clock.now += 2.4
    assert _post(client, RED).headers["retry-after"] == "1"
    clock.now += 0.1
    assert _post(client, RED).status_code == 200


def test_keys_sharing_a_label_share_its_buckets_and_tenants_their_policy():
    other_red = "sk-red-second"
    labels = {**LABELS, other_red: "team-red"}
    clock, metrics = Clock(), GatewayMetrics()
    limits = RateLimits(
        default=Policy(requests=Limit(1, 1)),
        tenants={"auth:team-blue": Policy(requests=Limit(1, 3))},
    )
    keys = [RED, other_red, BLUE, PLAIN]
    stack = RateLimitMiddleware(generating_app, RateLimiter(limits, clock, metrics), {ROUTE})
    stack = ApiKeyMiddleware(
        stack, keys, Surfaces.of(keys, [], "open", True), key_callers(keys, labels)
    )
    client = TestClient(stack)
    assert _post(client, RED).status_code == 200
    assert _post(client, other_red).status_code == 429  # team-red's one request is spent
    assert [_post(client, BLUE).status_code for _ in range(4)] == [200, 200, 200, 429]
    assert [_post(client, PLAIN).status_code for _ in range(2)] == [200, 429]


def test_without_keys_each_client_address_has_its_own_bucket():
    clock, metrics = Clock(), GatewayMetrics()
    limiter = RateLimiter(RateLimits(default=Policy(requests=Limit(1, 1))), clock, metrics)
    app = RateLimitMiddleware(generating_app, limiter, {ROUTE})
    first = TestClient(app, client=("10.0.0.1", 5000))
    second = TestClient(app, client=("10.0.0.2", 5000))
    assert [_post(first, None).status_code for _ in range(2)] == [200, 429]
    assert _post(second, None).status_code == 200
    assert set(limiter.callers) == {"ip:10.0.0.1", "ip:10.0.0.2"}


def test_only_generation_posts_are_limited():
    client, _, _ = _gateway(RateLimits(default=Policy(requests=Limit(1, 1))))
    _post(client, RED)
    assert _post(client, RED).status_code == 429
    assert client.get("/v1/models", headers={"Authorization": f"Bearer {RED}"}).status_code == 200


def test_the_global_rate_refuses_everyone_and_says_so():
    client, clock, _ = _gateway(RateLimits(global_requests=Limit(1, 2)))
    assert [_post(client, k).status_code for k in (RED, BLUE, PLAIN)] == [200, 200, 429]
    refused = _post(client, RED)
    assert refused.json()["error"]["message"].startswith(
        "rate limit exceeded: the gateway's request rate (1 per second)"
    )


def test_metrics_name_callers_by_label_or_hash_never_by_key(caplog):
    client, _, metrics = _gateway(
        RateLimits(default=Policy(requests=Limit(1, 1), generated_tokens=Limit(100, 100)))
    )
    with caplog.at_level(logging.DEBUG):
        for key, tokens in ((RED, 7), (RED, 0), (PLAIN, 5), (None, 0)):
            _post(client, key, tokens)
    text = metrics.exposition().decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    plain = f"auth:sha256:{key_hash(PLAIN)}"
    assert samples[("mmgate_rate_limit_admitted_total", (("caller", "auth:team-red"),))] == 1
    assert samples[("mmgate_rate_limit_admitted_total", (("caller", plain),))] == 1
    limited = ("mmgate_rate_limited_total", (("caller", "auth:team-red"), ("limit", "requests")))
    assert samples[limited] == 1
    assert samples[("mmgate_caller_generated_tokens_total", (("caller", "auth:team-red"),))] == 7
    assert samples[("mmgate_caller_generated_tokens_total", (("caller", plain),))] == 5
    assert caplog.records  # the access lines were written...
    for key in (RED, BLUE, PLAIN, "sk-red", "with:colons"):
        assert key not in text  # ...and neither they nor the metrics hold a key
        assert key not in caplog.text


def test_no_key_in_a_refusal():
    client, _, _ = _gateway(RateLimits(default=Policy(requests=Limit(1, 1))))
    _post(client, RED)
    refused = _post(client, RED)
    assert RED not in refused.text and "team-red" not in refused.text
    assert all(RED not in v for v in refused.headers.values())


def test_refusal_bodies_name_the_limit():
    from gateway.ratelimit.limiter import Refusal

    body = refusal_body(Refusal("requests", 0.2, 3))
    assert body["error"]["message"] == (
        "rate limit exceeded: this API key's requests (3 per second); retry after 1 s"
    )


@pytest.mark.parametrize("stream", [False, True])
def test_generation_charges_the_tokens_it_receives(stream):
    """gateway.stream.generation charges each chunk's tokens (a stream's Complete repeats the
    last delta: not charged again), or a final-only reply's Complete's."""
    from gateway.stream.generation import Generation
    from protos import vllm_engine_pb2 as pb

    charged: list[int] = []

    class Meter:
        def charge(self, tokens: int) -> None:
            charged.append(tokens)

    generation = Generation.__new__(Generation)
    generation.generate = pb.GenerateRequest(stream=stream)
    generation._first_token_at = 0.0

    class Usage:
        prompt_tokens = cached_tokens = 0

    class Choice:
        def on_chunk(self, chunk):
            pass

        def on_complete(self, complete, whole):
            pass

    generation.usage = Usage()
    generation._choice = lambda index: Choice()
    token = usage.bind(Meter())
    try:
        if stream:
            for ids in ([1, 2], [3], [4, 5, 6]):
                chunk = pb.GenerateStreamChunk(token_ids=ids)
                generation._on_response(pb.GenerateResponse(chunk=chunk))
            complete = pb.GenerateComplete(output_ids=[4, 5, 6], finish_reason="stop")
        else:
            complete = pb.GenerateComplete(output_ids=[1, 2, 3, 4, 5, 6], finish_reason="stop")
        generation._on_response(pb.GenerateResponse(complete=complete))
    finally:
        usage.unbind(token)
    assert sum(charged) == 6
    usage.charge_generated(5)  # unbound: charges nobody
    assert sum(charged) == 6


def _layers(app) -> list[type]:
    layers = []
    while app is not None:
        layers.append(type(app))
        app = getattr(app, "app", None)
    return layers


def test_the_app_has_a_rate_limit_layer_only_when_a_limit_is_given():
    from gateway.server.app import create_app
    from gateway.server.config import GatewayConfig

    plain = GatewayConfig(model=".", workers=["grpc://127.0.0.1:9"], api_keys=[RED])
    assert RateLimitMiddleware not in _layers(create_app(plain))
    limited = GatewayConfig(
        model=".",
        workers=["grpc://127.0.0.1:9"],
        api_keys=[RED],
        rate_limits=RateLimits(Limit(1, 1)),
    )
    layers = _layers(create_app(limited))
    assert layers.index(ApiKeyMiddleware) < layers.index(RateLimitMiddleware)  # inside it
