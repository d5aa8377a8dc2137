"""OpenAI request -> our proto -> the worker's vLLM SamplingParams, against vLLM's own server
mapping of the same JSON (ChatCompletionRequest.to_sampling_params)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from vllm.entrypoints.openai.chat_completion.protocol import (
    ChatCompletionRequest as VllmChatRequest,
)
from vllm.exceptions import VLLMValidationError

from engine_server.sampling import sampling_params_from_proto
from gateway.api.protocol import ChatCompletionRequest
from gateway.api.sampling import SamplingError, max_tokens_for, to_proto

MESSAGES = [{"role": "user", "content": "hi"}]
FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "max_tokens",
    "min_tokens",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "n",
    "logprobs",
    "prompt_logprobs",
    "seed",
    "include_stop_str_in_output",
    "logit_bias",
    "output_kind",
)
BODIES = {
    "defaults": {},
    "openai": {
        "temperature": 0.3,
        "top_p": 0.8,
        "frequency_penalty": 0.5,
        "presence_penalty": -0.5,
        "seed": 7,
        "n": 3,
        "stop": "END",
        "logprobs": True,
        "top_logprobs": 5,
        "logit_bias": {"12": -50},
    },
    "vllm-extensions": {
        "top_k": 20,
        "min_p": 0.1,
        "repetition_penalty": 1.2,
        "min_tokens": 4,
        "stop": ["a", "bb"],
        "stop_token_ids": [5, 6],
        "ignore_eos": True,
        "skip_special_tokens": False,
        "spaces_between_special_tokens": False,
        "include_stop_str_in_output": True,
        "prompt_logprobs": 2,
    },
    "top-k-disabled": {"top_k": -1, "temperature": 0},
    "logprobs-without-top": {"logprobs": True},
    "json-schema": {
        "response_format": {
            "type": "json_schema",
            "json_schema": {
                "name": "x",
                "schema": {"type": "object", "properties": {"a": {"type": "integer"}}},
            },
        }
    },
    "json-object": {"response_format": {"type": "json_object"}},
    "regex": {"structured_outputs": {"regex": "[0-9]+"}},
    "choice": {"structured_outputs": {"choice": ["yes", "no"]}},
    "grammar": {"structured_outputs": {"grammar": 'root ::= "a"'}},
}
DEFAULTS = {"temperature": 0.6, "top_p": 0.95}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("name", BODIES)
def test_same_sampling_params_as_vllm_server(name, stream):
    body = {"model": "m", "messages": MESSAGES, "stream": stream, **BODIES[name]}
    try:
        theirs = VllmChatRequest(**body).to_sampling_params(100, DEFAULTS)
    except (ValueError, VLLMValidationError):
        with pytest.raises(ValidationError):  # vLLM refuses it: so must we
            ChatCompletionRequest(**body)
        return
    proto = to_proto(ChatCompletionRequest(**body), 100, DEFAULTS)
    ours = sampling_params_from_proto(proto, stream=stream)
    for field in FIELDS:
        want, got = getattr(theirs, field), getattr(ours, field)
        if field == "top_k":
            want, got = max(want, 0), max(got, 0)
        assert got == pytest.approx(want), field
    assert (ours.structured_outputs is None) == (theirs.structured_outputs is None)
    if theirs.structured_outputs is not None:
        for field in ("json", "regex", "choice", "grammar", "json_object"):
            want = getattr(theirs.structured_outputs, field)
            got = getattr(ours.structured_outputs, field)
            if field == "json" and isinstance(want, dict):
                import json

                got = json.loads(got)
            assert got == want, field


def test_max_tokens_follow_vllm():
    assert max_tokens_for(None, 100, 1024, {}) == 924
    assert max_tokens_for(50, 100, 1024, {}) == 50
    assert max_tokens_for(5000, 100, 1024, {}) == 924
    assert max_tokens_for(None, 100, 1024, {"max_tokens": 30}) == 30
    with pytest.raises(SamplingError) as err:
        max_tokens_for(None, 2000, 1024, {})
    assert "maximum context length is 1024" in str(err.value)


@pytest.mark.parametrize(
    "body",
    [
        {"use_beam_search": True},
        {"bad_words": ["x"]},
        {"n": 0},
        {"top_logprobs": 50},
        {"response_format": {"type": "json_schema"}},
        {"structured_outputs": {"regex": "a", "choice": ["b"]}},
    ],
)
def test_refused_with_a_validation_error(body):
    with pytest.raises(ValidationError):
        ChatCompletionRequest(model="m", messages=MESSAGES, **body)


def test_logit_bias_keys_are_refused_as_vllm_refuses_them():
    from gateway.api.sampling import _logit_bias
    from gateway.errors import SamplingError

    assert _logit_bias({"5": 1.5, "0": -100}) == {5: 1.5, 0: -100.0}
    with pytest.raises(SamplingError, match=r"cannot be converted to integer token IDs: \['a'"):
        _logit_bias({"a": 1, "1.5": 2})
    for key in ("-1", str(2**31), "99999999999999999999"):  # past the wire's int32 too
        with pytest.raises(SamplingError, match="out-of-vocab token ids"):
            _logit_bias({key: 1})


def test_more_output_tokens_than_the_context_is_refused_as_in_vllm():
    from gateway.api.sampling import check_max_tokens
    from gateway.errors import SamplingError

    check_max_tokens(None, 1024, "max_tokens")
    check_max_tokens(1024, 1024, "max_tokens")  # clamped to the room left, as vLLM does
    with pytest.raises(SamplingError) as refused:
        check_max_tokens(1025, 1024, "max_completion_tokens")
    assert refused.value.message == (
        "max_completion_tokens=1025 cannot be greater than max_model_len=1024. "
        "Please request fewer output tokens."
    )
    assert refused.value.param == "max_completion_tokens"


# (chat's `echo` was here: it is now refused when true, test_request_fields.py)
@pytest.mark.parametrize("field", ["stream", "include_reasoning", "logprobs", "ignore_eos"])
@pytest.mark.parametrize("value", ["yes", "true", 1, 0])
def test_booleans_are_strict(field, value):
    from gateway.api.protocol import ChatCompletionRequest
    from gateway.errors import GatewayError, parse_body

    body = {"messages": [{"role": "user", "content": "hi"}], field: value}
    with pytest.raises(GatewayError) as refused:
        parse_body(ChatCompletionRequest, body)
    assert refused.value.param == field
    assert parse_body(ChatCompletionRequest, {**body, field: True}).model_dump()[field] is True


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("stop_token_ids", [-1]),
        ("stop_token_ids", [2**32]),
        ("top_k", 2**32),
        ("min_tokens", 2**32),
        ("max_tokens", 2**32),
        ("prompt_logprobs", -2),
        ("truncate_prompt_tokens", 2**31),
        ("temperature", float("inf")),
        ("logit_bias", {"1": float("-inf")}),
    ],
)
def test_values_the_wire_cannot_carry_are_refused_by_name(field, value):
    from gateway.errors import GatewayError, parse_body

    with pytest.raises(GatewayError) as refused:
        parse_body(ChatCompletionRequest, {"messages": MESSAGES, field: value})
    assert refused.value.status == 400
    assert refused.value.param.split(".")[0] == field


# Each value as JSON sends it: ints, -1 (unlimited), and what vLLM refuses (below -1, bools,
# floats, strings).
BUDGETS = (None, 0, 3, 1024, -1, -2, True, False, 3.0, 2.5, "3")


@pytest.mark.parametrize("budget", BUDGETS, ids=repr)
def test_thinking_token_budget_is_vllm_s_from_request_to_engine(budget):
    """Accepted and refused as vLLM's server does, with its message; what it accepts reaches
    the worker's SamplingParams through the call's metadata (the proto has no field)."""
    from engine_server.servicer import thinking_budget
    from gateway.errors import GatewayError, parse_body
    from protos import extensions

    body = {"model": "m", "messages": MESSAGES, "thinking_token_budget": budget}
    try:
        theirs = VllmChatRequest(**body).to_sampling_params(100, DEFAULTS)
    except VLLMValidationError as refused:  # not a ValueError: pydantic lets it through
        with pytest.raises(GatewayError) as ours:
            parse_body(ChatCompletionRequest, body)
        # vLLM's server answers str(error) with the error's parameter
        assert (ours.value.status, ours.value.message) == (400, str(refused))
        assert ours.value.param == refused.parameter == "thinking_token_budget"
        return
    request = parse_body(ChatCompletionRequest, body)
    metadata = extensions.thinking_budget_metadata(request.thinking_token_budget)
    proto = to_proto(request, 100, DEFAULTS)
    ours = sampling_params_from_proto(
        proto, stream=False, thinking_token_budget=thinking_budget(metadata)
    )
    assert ours.thinking_token_budget == theirs.thinking_token_budget
    assert (metadata == ()) == (theirs.thinking_token_budget is None)
