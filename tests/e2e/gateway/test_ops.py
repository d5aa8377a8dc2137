"""The gateway's operational surface against our worker on vLLM: /tokenize and /detokenize
equal to vLLM's handlers, API keys, CORS, request ids in headers and logs, /metrics."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.engines import MAX_MODEL_LEN
from tests.support.gateway_process import GatewayProcess
from tests.support.vllm_tokenize import VllmTokenization

KEY = "sk-test-key"
ORIGIN = "https://app.example"
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a prime number, héhé 😀."},
]
WEATHER = {
    "type": "function",
    "function": {"name": "weather", "parameters": {"type": "object", "properties": {}}},
}


@pytest.fixture(scope="module")
def gateway(text_model, text_worker, tmp_path_factory):
    log = tmp_path_factory.mktemp("gw-ops") / "gateway.log"
    extra = ["--api-key", KEY, "--allowed-origins", ORIGIN, "--log-format", "json"]
    proc = GatewayProcess(text_model, [text_worker.address], log, *extra).wait_ready()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def vllm_tokenize(text_model) -> VllmTokenization:
    return VllmTokenization(text_model, max_model_len=MAX_MODEL_LEN)


def client(gateway: GatewayProcess, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key=key, max_retries=0)


def model_name(gateway: GatewayProcess) -> str:
    return client(gateway).models.list().data[0].id


def post(gateway: GatewayProcess, path: str, body: dict, **headers: str) -> httpx.Response:
    return httpx.post(f"{gateway.base_url}{path}", json=body, headers=headers, timeout=60)


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": "def f(x): return x  # héhé 😀"},
        {"prompt": "hello", "add_special_tokens": False, "return_token_strs": True},
        {"messages": MESSAGES},
        {"messages": MESSAGES, "add_generation_prompt": False, "return_token_strs": True},
        {"messages": [*MESSAGES, {"role": "assistant", "content": "Se"}],
         "add_generation_prompt": False, "continue_final_message": True},
        {"messages": MESSAGES, "tools": [WEATHER]},
        {"messages": MESSAGES, "add_special_tokens": True},
    ],
)  # fmt: skip
def test_tokenize_equals_vllm(gateway, vllm_tokenize, body):
    reply = post(gateway, "/tokenize", body)
    assert reply.status_code == 200, reply.text
    assert reply.json() == vllm_tokenize.tokenize(body)


def test_detokenize_equals_vllm(gateway, vllm_tokenize):
    ids = post(gateway, "/tokenize", {"messages": MESSAGES}).json()["tokens"]
    for tokens in (ids, ids[3:9], [3001, 3005, 17, 3002], []):
        reply = post(gateway, "/detokenize", {"tokens": tokens})
        assert reply.status_code == 200, reply.text
        assert reply.json() == vllm_tokenize.detokenize(tokens)


def test_tokenize_refuses_bad_input(gateway):
    assert post(gateway, "/detokenize", {"tokens": [10**6]}).status_code == 400
    assert post(gateway, "/tokenize", {"prompt": 5}).status_code == 400
    assert post(gateway, "/tokenize", {"prompt": "x", "model": "other"}).status_code == 404
    refused = post(gateway, "/tokenize", {"messages": MESSAGES, "chat_template": "{{ 1 }}"})
    assert refused.status_code == 400
    assert "trust-request-chat-template" in refused.json()["error"]["message"]


def test_api_key_guards_v1(gateway):
    with pytest.raises(openai.AuthenticationError) as raised:
        client(gateway, "wrong").models.list()
    assert raised.value.body["message"] == "invalid or missing API key"
    missing = httpx.get(f"{gateway.base_url}/v1/models")
    assert missing.status_code == 401
    assert missing.json()["error"]["code"] == 401
    assert client(gateway).models.list().data
    for path in ("/health", "/ready", "/metrics", "/version"):
        assert httpx.get(f"{gateway.base_url}{path}").status_code == 200


def test_cors_allows_only_the_configured_origin(gateway):
    preflight = {
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    }
    url = f"{gateway.base_url}/v1/chat/completions"
    allowed = httpx.options(url, headers={"Origin": ORIGIN, **preflight})
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == ORIGIN
    other = httpx.options(url, headers={"Origin": "https://evil.example", **preflight})
    assert "access-control-allow-origin" not in other.headers
    simple = httpx.get(f"{gateway.base_url}/v1/models", headers={"Origin": ORIGIN,
                       "Authorization": f"Bearer {KEY}"})  # fmt: skip
    assert simple.headers["access-control-allow-origin"] == ORIGIN
    assert "x-request-id" in simple.headers["access-control-expose-headers"].lower()


def test_request_id_in_header_body_and_logs(gateway):
    chat = client(gateway).chat.completions.with_raw_response.create(
        model=model_name(gateway),
        messages=MESSAGES,
        max_tokens=3,
        extra_headers={"X-Request-Id": "trace-42"},
    )
    assert chat.headers["x-request-id"] == "trace-42"
    assert chat.parse().id == "chatcmpl-trace-42"  # as vLLM names it
    fresh = httpx.get(f"{gateway.base_url}/health").headers["x-request-id"]
    assert len(fresh) == 32
    deadline = time.monotonic() + 5  # info lines are written in batches, every 0.1 s
    while True:
        lines = [json.loads(line) for line in gateway.log_path.read_text().splitlines()
                 if line.startswith("{")]  # fmt: skip
        access = [e for e in lines if e.get("request_id") == "trace-42"]
        if access or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert access, "no log line carries the request id"
    line = access[-1]
    assert line["logger"] == "mmgate.access"
    assert line["status"] == 200 and line["msg"] == "POST /v1/chat/completions 200"
    assert line["duration_ms"] > 0


def test_the_posture_line_names_the_surfaces_and_no_log_line_holds_the_key(gateway):
    client(gateway).models.list()
    httpx.get(f"{gateway.base_url}/v1/models", headers={"Authorization": "Bearer wrong"})
    text = gateway.log_path.read_text()
    lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    (posture,) = [e for e in lines if e.get("logger") == "mmgate.security"]
    assert posture["level"] == "info"  # on loopback
    assert "/v1 api key required (1 accepted)" in posture["msg"]
    assert "/admin api key required" in posture["msg"] and "/metrics OPEN" in posture["msg"]
    assert KEY not in text


def test_no_process_title_shows_the_key_given_as_a_flag(gateway):
    """The gateway got `--api-key KEY` on its command line: its title (what `ps` and
    /proc/PID/cmdline show every user) has it masked, and no process shows it."""
    title = Path(f"/proc/{gateway.proc.pid}/cmdline").read_bytes()
    assert b"--api-key ***" in title
    shown = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):  # a process that ended while we looked
            shown += [cmdline] if KEY.encode() in cmdline.read_bytes() else []
    assert not shown


def scrape(gateway: GatewayProcess) -> dict[tuple[str, tuple], float]:
    text = httpx.get(f"{gateway.base_url}/metrics").text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_metrics_count_requests_tokens_and_latency(gateway, text_worker):
    before = scrape(gateway)
    c, model = client(gateway), model_name(gateway)
    reply = c.chat.completions.create(model=model, messages=MESSAGES, max_tokens=5, temperature=0)
    stream = c.chat.completions.create(
        model=model,
        messages=MESSAGES,
        max_tokens=4,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    assert "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model=model, messages=MESSAGES, max_tokens=0)
    after = scrape(gateway)

    def grew(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    route = "/v1/chat/completions"
    assert grew("mmgate_requests_total", route=route, status="200") == 2
    assert grew("mmgate_requests_total", route=route, status="400") == 1
    assert grew("mmgate_request_duration_seconds_count", route=route) == 3
    # token timings come from the streamed request only (the other gets its tokens at once)
    assert grew("mmgate_time_to_first_token_seconds_count") == 1
    assert grew("mmgate_time_per_output_token_seconds_count") == 1
    assert grew("mmgate_prompt_tokens_total") == 2 * reply.usage.prompt_tokens
    assert grew("mmgate_generation_tokens_total") == reply.usage.completion_tokens + 4
    worker = f"grpc://{text_worker.address}"
    assert after[("mmgate_worker_healthy", (("worker", worker),))] == 1
    assert after[("mmgate_worker_requests_in_flight", (("worker", worker),))] == 0
    assert after[("mmgate_requests_in_flight", (("route", route),))] == 0
