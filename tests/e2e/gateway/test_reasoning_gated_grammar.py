"""A structured output waits for the reasoning to end, over our wire as in vLLM's server.

With a reasoning parser, vLLM's engine applies a request's grammar only once its reasoning
parser has seen the thought end, unless the server tells it reasoning already ended
(``reasoning_ended``: the prompt closed the thought, or reasoning is hidden with
``include_reasoning: false``). Engines here run without ``enable_in_reasoning``; mmgate sends
``grammar_from_first_token`` where vLLM's server passes ``reasoning_ended=True``, and its worker
otherwise lets the engine check the prompt itself. The replies must equal vLLM's.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.gateway.test_tool_calls import ASK
from tests.e2e.gateway.test_tool_calls import marker_bias as bias_towards
from tests.support.engines import VllmServerProcess, WorkerProcess
from tests.support.family_e2e import REFERENCE_NAME
from tests.support.gateway_process import GatewayProcess
from tests.support.qwen3_tools_model import GATEWAY_ARGS, PARSER_FLAGS, SERVER_FLAGS, build_model

ENGINE = {"max_model_len": 2048}
ANSWER = "The answer is 42."
# name -> (request fields, the content vLLM gives). A pull towards </think> makes the model
# close its thought at once. Gated (thinking on), the grammar starts after that </think>: the
# answer is content. From the first token (thought hidden), the grammar allows no </think>:
# the answer stays inside the thought, and content is null.
CASES: dict[str, tuple[dict[str, Any], str | None]] = {
    "thinking": ({}, ANSWER),
    "thinking_off": ({"chat_template_kwargs": {"enable_thinking": False}}, ANSWER),
    "reasoning_hidden": ({"include_reasoning": False}, None),
}


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    model = build_model(tmp_path_factory.mktemp("qwen3-gated") / "model")
    logs = tmp_path_factory.mktemp("gated")
    vllm = VllmServerProcess(model, logs / "vllm.log", **PARSER_FLAGS, **SERVER_FLAGS, **ENGINE)
    worker = WorkerProcess(model, logs / "worker.log", **PARSER_FLAGS, **ENGINE)
    gateway = None
    try:
        vllm.wait_ready()
        worker.wait_ready()
        gateway = GatewayProcess(model, [worker.address], logs / "gateway.log", *GATEWAY_ARGS)
        yield vllm.client(), gateway.wait_ready().client(), str(model)
    finally:
        if gateway is not None:
            gateway.stop()
        worker.stop()
        vllm.stop()


def _ask(client: Any, model: str, case: str) -> Any:
    body = {"structured_outputs": {"choice": [ANSWER]}, **CASES[case][0]}
    return client.chat.completions.create(
        model=model,
        messages=ASK,
        temperature=0,
        max_tokens=40,
        logit_bias=bias_towards(("</think>",)),
        extra_body=body,
    )


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_grammar_starts_where_vllm_starts_it(servers, case):
    vllm, ours, model = servers
    expected, got = _ask(vllm, REFERENCE_NAME, case), _ask(ours, model, case)
    assert got.choices[0].message.content == expected.choices[0].message.content
    assert got.choices[0].message.reasoning == expected.choices[0].message.reasoning
    assert got.usage.completion_tokens == expected.usage.completion_tokens
    assert expected.choices[0].message.content == CASES[case][1]
