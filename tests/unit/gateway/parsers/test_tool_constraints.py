"""The grammar a request with tools is sent with, against vLLM 0.32's adjust_request (for gpt-oss,
HarmonyParser's, which also frames a structured output without tools)."""

from __future__ import annotations

import functools
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

# GLM's shallow tags read these keywords; the odd name shows how names go into begin strings.
TYPED = {
    "type": "function",
    "function": {
        "name": 'book "room" é',
        "parameters": {
            "type": "object",
            "properties": {
                "room": {"enum": ["a", 2, None, [1, "ü"]]},
                "only": {"enum": ["x"]},
                "nights": {"type": ["integer", "null"]},
                "note": {"type": ["string", "null"]},
                "tags": {"type": ["string"]},
                "meta": {"type": "object"},
                "when": {"type": "string"},
            },
            "required": ["room"],
        },
    },
}
OPEN = {
    "type": "function",
    "function": {
        "name": "open",
        "parameters": {
            "type": "object",
            "properties": {"x": {"type": "string"}},
            "additionalProperties": True,
        },
    },
}
UNION = {
    "type": "function",
    "function": {
        "name": "union",
        "parameters": {"anyOf": [{"type": "object", "properties": {"x": {"type": "string"}}}]},
    },
}

TOOL_SETS = {
    "one": [WEATHER],
    "two": [WEATHER, ADD],
    "strict": [WEATHER, STRICT_ADD],
    "strict_no_params": [STRICT_PING, WEATHER],
    "typed": [WEATHER, TYPED, OPEN, UNION],
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


# Parsers whose vLLM class forces calls in the model's own format (a structural tag, or none at
# all for gemma4); vLLM runs openai (gpt-oss) as HarmonyParser.
NATIVE_PARSERS = [
    "deepseek_v31",
    "gemma4",
    "glm45",
    "glm47",
    "hermes",
    "kimi_k2",
    "llama3_json",
    "llama4_json",
    "openai",
    "qwen3_coder",
    "qwen3_xml",
]


@functools.cache
def _tokenizer() -> Any:
    """One tokenizer with every family's markers (the parsers' constructors look them up)."""
    from gateway.parsers import deepseek_v31_tool
    from gateway.parsers import gemma4_tool as gemma4
    from gateway.parsers import glm45_tool as glm45
    from gateway.parsers import kimi_k2_tool as kimi_k2

    markers = ("<|python_tag|>", *deepseek_v31_tool.MARKERS, *kimi_k2.MARKERS, *gemma4.MARKERS)
    markers += (glm45.TOOL_CALL_START, "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>")
    markers += ("</arg_value>", "<think>", "</think>", "<turn|>", "<|turn>", "<|tool_response>")
    return tokenizer((), tuple(dict.fromkeys(markers)))


def _vllm(parser_name: str, tools: list, tool_choice: Any, parallel: bool | None, so: Any):
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.parser.parser_manager import ParserManager

    logging.getLogger("vllm").setLevel(logging.ERROR)
    harmony = parser_name == "openai"
    cls = ParserManager.get_parser(
        tool_parser_name=parser_name,
        reasoning_parser_name="openai_gptoss" if harmony else None,
        enable_auto_tools=True,
        is_harmony=harmony,
    )
    body: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "tool_choice": tool_choice,
    }
    if tools:  # vLLM refuses an empty list
        body["tools"] = json.loads(json.dumps(tools))
    if parallel is not None:
        body["parallel_tool_calls"] = parallel
    if so is not None:
        body["structured_outputs"] = so
    request = ChatCompletionRequest(**body)
    request = cls(_tokenizer(), request.tools).adjust_request(request)
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
@pytest.mark.parametrize("parser", NATIVE_PARSERS)
def test_native_constraint_matches_vllm(
    parser: str, tools: str, choice: str, parallel, so: str
) -> None:
    args = (TOOL_SETS[tools], CHOICES[choice], parallel, STRUCTURED[so])
    ours = tool_structured_outputs(tool_parser(parser), *args)
    expected = _vllm(parser, *args)
    if expected is None or expected == STRUCTURED[so]:
        # vLLM leaves the request's own structured output in place.
        assert ours is None
    else:
        assert ours is not None and _comparable(ours) == expected


@pytest.mark.parametrize("so", ["none", "choice", "regex", "json"])
@pytest.mark.parametrize("tools", ["no_tools", "one"])
def test_harmony_frames_structured_output_without_calls(tools: str, so: str) -> None:
    # gpt-oss holds a structured output to its final message even when no call can happen.
    args = (TOOL_SETS.get(tools, []), "none", None, STRUCTURED[so])
    ours = tool_structured_outputs(tool_parser("openai"), *args)
    expected = _vllm("openai", *args)
    if expected is None:
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
