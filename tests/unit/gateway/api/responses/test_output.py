"""A chat result as a Response equals vLLM's: the output items of build_response_output_items
and the object of ResponsesResponse.from_request, dumped as its server dumps them (ids
masked)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from gateway.api.responses import output
from gateway.api.responses.protocol import ResponsesRequest

_IDS = re.compile(r"^(rs|msg|fc)_[0-9a-f]{16}$")
LOGPROBS = [
    {
        "token": "Hi",
        "logprob": -0.5,
        "bytes": [72, 105],
        "top_logprobs": [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105]}],
    }
]
CALLS = [
    {"id": "chatcmpl-tool-1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
    {"id": "chatcmpl-tool-2", "type": "function", "function": {"name": "g", "arguments": "[]"}},
]
MESSAGES: dict[str, dict[str, Any]] = {
    "text": {"content": "Hi", "reasoning": None},
    "reasoning_text": {"content": "Hi", "reasoning": "Think."},
    "reasoning_calls": {"content": None, "reasoning": "Think.", "tool_calls": CALLS},
    "text_calls": {"content": "Checking.", "reasoning": None, "tool_calls": CALLS[:1]},
    "empty": {"content": "", "reasoning": None},
}
BODIES: dict[str, dict[str, Any]] = {
    "plain": {"input": "Hi"},
    "everything": {
        "input": "Hi",
        "instructions": "Be brief.",
        "metadata": {"k": "v"},
        "user": "u1",
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "tool_choice": {"type": "function", "name": "f"},
        "parallel_tool_calls": False,
        "reasoning": {"effort": "low"},
        "text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": "object"}}},
        "include": ["message.output_text.logprobs"],
        "top_logprobs": 3,
        "truncation": "auto",
        "max_tool_calls": 2,
    },
    "json_object": {"input": "Hi", "text": {"format": {"type": "json_object"}}},
}


def masked(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: masked(v) for k, v in value.items()}
    if isinstance(value, list):
        return [masked(v) for v in value]
    if isinstance(value, str) and _IDS.match(value):
        return value[: value.index("_")] + "_ID"
    return value


@pytest.fixture(scope="module")
def vllm():
    from vllm.entrypoints.generate.base.protocol import FunctionCall
    from vllm.entrypoints.openai.responses import protocol, utils
    from vllm.sampling_params import SamplingParams

    return protocol, utils, FunctionCall, SamplingParams


def _vllm_items(vllm, message: dict, logprobs: list[dict] | None) -> list[dict]:
    protocol, utils, FunctionCall, _ = vllm
    from openai.types.responses.response_output_text import Logprob

    calls = [
        FunctionCall(id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"])
        for c in message.get("tool_calls") or []
    ]
    built = utils.build_response_output_items(
        reasoning=message["reasoning"],
        content=message["content"],
        tool_calls=calls,
        logprobs=[Logprob(**lp) for lp in logprobs] if logprobs else None,
    )
    return [item.model_dump(mode="json", by_alias=True) for item in built]


@pytest.mark.parametrize("logprobs", [None, LOGPROBS], ids=["plain", "logprobs"])
@pytest.mark.parametrize("case", MESSAGES)
def test_output_items_equal_vllm(vllm, case, logprobs):
    message = MESSAGES[case]
    ours = output.output_items(message, logprobs, parsed=True)
    assert masked(ours) == masked(_vllm_items(vllm, message, logprobs))


def test_without_a_parser_the_message_is_always_there():
    (item,) = output.output_items({"content": ""}, None, parsed=False)
    assert (item["type"], item["content"]) == ("message", [])


@pytest.mark.parametrize("status", ["completed", "incomplete", "in_progress"])
@pytest.mark.parametrize("body", BODIES)
def test_response_object_equals_vllm(vllm, body, status):
    protocol, _, _, SamplingParams = vllm
    theirs_request = protocol.ResponsesRequest(**BODIES[body])
    ours_request = ResponsesRequest.model_validate(
        {**BODIES[body], "request_id": theirs_request.request_id}
    )
    logprobs = 3 if ours_request.include_logprobs() else None
    params = SamplingParams(
        temperature=0.5, top_p=0.9, max_tokens=77, presence_penalty=0.1, logprobs=logprobs
    )
    usage = None if status == "in_progress" else output.usage(CHAT_USAGE)
    theirs = protocol.ResponsesResponse.from_request(
        theirs_request,
        params,
        model_name="m",
        created_time=5,
        output=[],
        status=status,
        usage=protocol.ResponseUsage.model_validate(usage) if usage else None,
    ).model_dump(mode="json", by_alias=True)
    echo = output.Echo(0.5, 0.9, 0.1, 0.0, 77)
    ours = output.response_object(
        ours_request,
        model="m",
        created_at=5,
        echo=echo,
        output=[],
        status=status,
        usage=usage,
    )
    assert ours == theirs


CHAT_USAGE = {
    "prompt_tokens": 10,
    "completion_tokens": 7,
    "total_tokens": 17,
    "prompt_tokens_details": {"cached_tokens": 4},
    "completion_tokens_details": {"reasoning_tokens": 3},
}


def test_usage_carries_reasoning_tokens():
    usage = output.usage(CHAT_USAGE)
    assert (usage["input_tokens"], usage["output_tokens"], usage["total_tokens"]) == (10, 7, 17)
    assert usage["output_tokens_details"]["reasoning_tokens"] == 3
    assert usage["input_tokens_details"]["cached_tokens"] == 4


def test_status_follows_the_finish_reason():
    assert output.status_of("length") == "incomplete"
    assert [output.status_of(r) for r in ("stop", "tool_calls", None)] == ["completed"] * 3
