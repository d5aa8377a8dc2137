"""`kv_transfer_params` (disaggregated prefill and decode) cross the gateway as they cross
vLLM's server: the request's object reaches the engine (`kv_transfer_params_json`), and what
the engine's KV connector returns comes back in the non-streamed response.

The worker here is the fake: a real vLLM engine returns kv_transfer_params only from a KV
connector (NIXL, Mooncake, ...), which does not run on vLLM for CPUs, so no real worker can be
made to return them. That a real worker takes the forwarded object, and that a chat's
`prompt_token_ids` is the prompt, is shown against vLLM in test_openai.py."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.support.fake_worker import FakeWorker
from tests.support.gateway_process import GatewayProcess

MESSAGES = [{"role": "user", "content": "hi"}]
PARAMS = {"do_remote_prefill": True, "remote_block_ids": [1, 2], "remote_host": "10.0.0.1"}
RETURNED = {"do_remote_decode": False, "remote_engine_id": "prefill-0", "remote_port": 5600}


@pytest.fixture(scope="module")
def setup(text_model, tmp_path_factory):
    worker = FakeWorker(text_model, [300, 301, 302])
    worker.servicer.kv_transfer_params_json = json.dumps(RETURNED)
    logs = tmp_path_factory.mktemp("kv") / "gateway.log"
    gateway = GatewayProcess(text_model, [worker.address], logs).wait_ready()
    yield worker, gateway
    gateway.stop()
    worker.stop()


def _post(gateway, path: str, body: dict) -> httpx.Response:
    return httpx.post(gateway.base_url + path, json=body, timeout=60)


def test_chat_forwards_the_params_and_returns_the_engines(setup):
    worker, gateway = setup
    body = {"messages": MESSAGES, "max_tokens": 3, "kv_transfer_params": PARAMS}
    reply = _post(gateway, "/v1/chat/completions", body)
    assert reply.status_code == 200, reply.text
    assert reply.json()["kv_transfer_params"] == RETURNED
    assert json.loads(worker.servicer.requests[-1].kv_transfer_params_json) == PARAMS


def test_chat_keeps_prompt_token_ids_to_itself(setup):
    worker, gateway = setup
    params = {**PARAMS, "prompt_token_ids": [1, 2, 3]}
    body = {"messages": MESSAGES, "max_tokens": 3, "kv_transfer_params": params}
    assert _post(gateway, "/v1/chat/completions", body).status_code == 200
    sent = worker.servicer.requests[-1]
    assert json.loads(sent.kv_transfer_params_json) == PARAMS
    assert list(sent.tokenized.input_ids) == [1, 2, 3]


def test_completions_forward_the_object_verbatim(setup):
    worker, gateway = setup
    params = {**PARAMS, "prompt_token_ids": [1, 2, 3]}
    body = {"prompt": "hi", "max_tokens": 3, "kv_transfer_params": params}
    reply = _post(gateway, "/v1/completions", body)
    assert reply.status_code == 200, reply.text
    assert reply.json()["kv_transfer_params"] == RETURNED
    assert json.loads(worker.servicer.requests[-1].kv_transfer_params_json) == params


def test_none_sent_none_forwarded(setup):
    worker, gateway = setup
    for params in (None, {}):
        body = {"messages": MESSAGES, "max_tokens": 3, "kv_transfer_params": params}
        assert _post(gateway, "/v1/chat/completions", body).status_code == 200
        assert not worker.servicer.requests[-1].HasField("kv_transfer_params_json")


@pytest.mark.parametrize("ids", [[], [-1], [1, True], "1,2", [1.0], [10**9]])
def test_bad_prompt_token_ids_are_a_400(setup, ids):
    _, gateway = setup
    body = {"messages": MESSAGES, "kv_transfer_params": {"prompt_token_ids": ids}}
    reply = _post(gateway, "/v1/chat/completions", body)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == "kv_transfer_params.prompt_token_ids"
