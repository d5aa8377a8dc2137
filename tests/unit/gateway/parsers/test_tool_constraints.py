"""The grammar a request with tools is sent with, against vLLM 0.32's adjust_request."""

from __future__ import annotations

import itertools
import json
import logging
from typing import Any

import pytest

from gateway.parsers import tool_parser
from gateway.parsers.tool_constraints import tool_structured_outputs
from tests.unit.gateway.parsers.vllm_reference import tokenizer

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"$ref": "#/$defs/n"}},
            "required": ["a"],
            "$defs": {"n": {"type": "number"}},
        },
    },
}
NO_PARAMS = {"type": "function", "function": {"name": "ping"}}
STRICT_ADD = {**ADD, "function": {**ADD["function"], "strict": True}}
STRICT_PING = {**NO_PARAMS, "function": {**NO_PARAMS["function"], "strict": True}}

TOOL_SETS = {
    "one": [WEATHER],
    "two": [WEATHER, ADD],
    "strict": [WEATHER, STRICT_ADD],
    "strict_no_params": [STRICT_PING, WEATHER],
}
CHOICES = {
    "auto": "auto",
    "required": "required",
    "named": {"type": "function", "function": {"name": "get_weather"}},
}
STRUCTURED = {
    "none": None,
    "choice": {"choice": ["a", "b"]},
    "regex": {"regex": "x+"},
    "json": {"json": {"type": "object"}},
}


def _vllm(parser_name: str, tools: list, tool_choice: Any, parallel: bool | None, so: Any):
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.parser.parser_manager import ParserManager

    logging.getLogger("vllm").setLevel(logging.ERROR)
    cls = ParserManager.get_parser(
        tool_parser_name=parser_name, reasoning_parser_name=None, enable_auto_tools=True
    )
    body: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": json.loads(json.dumps(tools)),
        "tool_choice": tool_choice,
    }
    if parallel is not None:
        body["parallel_tool_calls"] = parallel
    if so is not None:
        body["structured_outputs"] = so
    request = ChatCompletionRequest(**body)
    request = cls(tokenizer(), request.tools).adjust_request(request)
    result = request.structured_outputs
    if result is None:
        return None
    fields = {k: v for k, v in vars(result).items() if v not in (None, False) and k[0] != "_"}
    return _comparable(fields)


def _comparable(fields: dict[str, Any]) -> dict[str, Any]:
    out = dict(fields)
    for key in ("structural_tag", "json"):
        if isinstance(out.get(key), str):
            out[key] = json.loads(out[key])
    return out


CASES = [
    (tools, choice, parallel, so)
    for tools, choice, parallel, so in itertools.product(
        TOOL_SETS, CHOICES, (None, True, False), STRUCTURED
    )
    if so == "none" or choice == "auto"  # vLLM refuses a structured output with a named tool
]


@pytest.mark.parametrize(("tools", "choice", "parallel", "so"), CASES)
def test_hermes_constraint_matches_vllm(tools: str, choice: str, parallel, so: str) -> None:
    args = (TOOL_SETS[tools], CHOICES[choice], parallel, STRUCTURED[so])
    ours = tool_structured_outputs(tool_parser("hermes"), *args)
    expected = _vllm("hermes", *args)
    if expected is None or expected == STRUCTURED[so]:
        # vLLM leaves the request's own structured output in place.
        assert ours is None
    else:
        assert ours is not None and _comparable(ours) == expected


@pytest.mark.parametrize("choice", ["required", "named"])
@pytest.mark.parametrize("parallel", [None, False])
def test_generic_json_constraint_matches_vllm(choice: str, parallel) -> None:
    # llama3_json has a structural tag model in vLLM; pythonic is the generic JSON path.
    args = ([WEATHER, ADD, NO_PARAMS], CHOICES[choice], parallel, None)

    class _Generic(type(tool_parser("hermes"))):
        native_required_and_named = False

    ours = tool_structured_outputs(_Generic(), *args)
    assert ours is not None and _comparable(ours) == _vllm("pythonic", *args)
