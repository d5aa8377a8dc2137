"""The grammar vLLM 0.32 has the engine decode under when a request offers tools.

vLLM's ``DelegatingParser._apply_structural_tag`` and ``ToolParser.adjust_request``, without
vLLM or xgrammar: the result is the ``structured_outputs`` value the request then carries, sent
to the engine like any other constraint.

- A parser with a native call format (``ToolParser.native_required_and_named``: vLLM's
  ``structural_tag_model`` under the default ``VLLM_ENFORCE_STRICT_TOOL_CALLING``) gets a
  structural tag built from its tools: for ``required`` and a named tool always; for ``auto``
  only when a tool is ``strict`` or ``parallel_tool_calls`` is false (otherwise the model is
  free, and a request's own structured output applies). ``auto`` with a structured output and a
  tag allows either a call or that output.
- Other parsers get vLLM's generic JSON form for ``required`` (a list of
  ``{"name", "parameters"}`` objects) and a named tool (its arguments object).

Two optional parser attributes (read with ``getattr``; vLLM names in brackets):

- ``default_tool_strict_level`` (``ToolParser.default_tool_strict_level``): ``STRICT_FUNCTION``
  constrains the call envelope of every request with tools, ``STRICT_PARAMETER`` also pins every
  tool's arguments to its schema (GLM-4.7 uses the first).
- ``wrap_output_format(format) -> format`` (harmony's ``_adjust_output_format``): the request's
  own structured output as the model must frame it (gpt-oss: inside its final channel); the
  result replaces the request's own even where no tag applies.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from gateway.parsers.base import ToolParser

ToolChoice = str | dict[str, Any]

# vLLM's ToolStrictLevel (``--tool-strict-level``), the default being STRICT_AUTO.
STRICT_AUTO, STRICT_FUNCTION, STRICT_PARAMETER = 0, 1, 2


def tool_function(tool: dict[str, Any]) -> dict[str, Any]:
    return tool.get("function") or {}


def named_tool(tool_choice: ToolChoice) -> str | None:
    """The function a named ``tool_choice`` forces; None for the string choices."""
    if isinstance(tool_choice, dict):
        return (tool_choice.get("function") or {}).get("name")
    return None


def _is_strict(tool: dict[str, Any]) -> bool:
    return tool_function(tool).get("strict") is True


def tag_tools(
    tools: list[dict[str, Any]],
    tool_choice: ToolChoice,
    single_call: bool,
    auto_with_format: bool,
    strict_level: int = STRICT_AUTO,
) -> list[dict[str, Any]] | None:
    """The tools a structural tag covers, each with ``strict`` pinned (vLLM's
    ``resolve_tool_strictness`` at ``strict_level``); None: no tag."""
    # Limiting the call count needs the call envelope in the grammar (vLLM raises the strict
    # level to "function" then), except for auto with a structured output.
    if single_call and not auto_with_format:
        strict_level = max(strict_level, STRICT_FUNCTION)
    if tool_choice == "auto" and strict_level == STRICT_AUTO and not any(map(_is_strict, tools)):
        return None
    name = named_tool(tool_choice)
    chosen = [t for t in tools if name is None or tool_function(t).get("name") == name]
    pin_all = strict_level >= STRICT_PARAMETER
    return [
        {**tool, "function": {**tool_function(tool), "strict": pin_all or _is_strict(tool)}}
        for tool in chosen
    ]


def arguments_schema(tool: dict[str, Any]) -> Any:
    """What a tag lets the arguments be: the parameters schema when strict, else any JSON."""
    function = tool_function(tool)
    parameters = function.get("parameters")
    return parameters if function.get("strict") and parameters is not None else True


# xgrammar's structural-tag formats as their ``model_dump()`` spells them (defaults included),
# for the model families' builders.


def json_schema_format(schema: Any, style: str = "json") -> dict[str, Any]:
    return {
        "type": "json_schema",
        "json_schema": schema,
        "style": style,
        "any_order": False,
        "max_whitespace_cnt": None,
        "excludes": [],
    }


def tag_format(begin: str, content: dict[str, Any], end: str | list[str]) -> dict[str, Any]:
    return {"type": "tag", "begin": begin, "content": content, "end": end}


def const_string_format(value: str) -> dict[str, Any]:
    return {"type": "const_string", "value": value}


def any_text_format(excludes: list[str] | None = None) -> dict[str, Any]:
    return {"type": "any_text", "excludes": excludes or [], "max_tokens": None, "max_chars": None}


def sequence_format(*elements: dict[str, Any]) -> dict[str, Any]:
    return {"type": "sequence", "elements": list(elements)}


def or_format(elements: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "or", "elements": elements}


def optional_format(content: dict[str, Any]) -> dict[str, Any]:
    return {"type": "optional", "content": content}


def triggered_tags_format(
    triggers: list[str],
    tags: list[dict[str, Any]],
    *,
    at_least_one: bool = False,
    stop_after_first: bool = False,
    excludes: list[str] | None = None,
) -> dict[str, Any]:
    return {"type": "triggered_tags", "triggers": triggers, "tags": tags,
            "at_least_one": at_least_one, "stop_after_first": stop_after_first,
            "excludes": excludes or []}  # fmt: skip


def tags_with_separator_format(
    tags: list[dict[str, Any]], *, at_least_one: bool = False, stop_after_first: bool = False
) -> dict[str, Any]:
    return {"type": "tags_with_separator", "tags": tags, "separator": "",
            "at_least_one": at_least_one, "stop_after_first": stop_after_first}  # fmt: skip


def structural_tag(fmt: dict[str, Any]) -> dict[str, Any]:
    return {"type": "structural_tag", "format": fmt}


def triggered_calls_tag(
    trigger: str,
    call_tag: Callable[[dict[str, Any]], dict[str, Any]],
    tools: list[dict[str, Any]],
    tool_choice: ToolChoice,
    single_call: bool,
) -> dict[str, Any]:
    """The shape xgrammar's builtin templates share (llama, qwen_3_coder): a named tool is that
    one call, bare; otherwise calls open with ``trigger`` anywhere in the text outside the
    thought, and ``required`` needs one."""
    if tool_choice not in ("auto", "required"):
        return structural_tag(call_tag(tools[0]))
    return structural_tag(
        triggered_tags_format(
            [trigger],
            [call_tag(tool) for tool in tools],
            at_least_one=tool_choice == "required",
            stop_after_first=single_call,
            excludes=["<think>", "</think>"],
        )
    )


def _output_format(structured: dict[str, Any]) -> dict[str, Any] | None:
    """A request's structured output as a structural-tag format (vLLM's
    ``structured_outputs_to_format``); None for kinds kept out of the tag."""
    if structured.get("json_object"):
        return json_schema_format({"type": "object"})
    if (schema := structured.get("json")) is not None:
        return json_schema_format(json.loads(schema) if isinstance(schema, str) else schema)
    if (pattern := structured.get("regex")) is not None:
        return {"type": "regex", "pattern": pattern}
    if (choices := structured.get("choice")) is not None:
        return or_format([const_string_format(c) for c in choices])
    return None


def tool_structured_outputs(
    parser: ToolParser,
    tools: list[dict[str, Any]],
    tool_choice: ToolChoice,
    parallel_tool_calls: bool | None,
    structured: dict[str, Any] | None,
) -> dict[str, Any] | None:
    """The ``structured_outputs`` the request is sent with instead of its own; None keeps the
    request's own (``structured``: its structured output as vLLM's field names spell it). A
    parser with ``wrap_output_format`` gets its framing of the request's own instead of None."""
    own_format = _output_format(structured) if structured else None
    own = None  # what goes out where vLLM leaves the request's structured output in place
    if (wrap := getattr(parser, "wrap_output_format", None)) and own_format is not None:
        # A model that frames the request's own output gets it framed even then.
        own_format = wrap(own_format)
        own = {"structural_tag": json.dumps(structural_tag(own_format))}
    if tool_choice == "none" or not tools:
        return own
    if not parser.native_required_and_named:
        return _generic_json(tools, tool_choice, parallel_tool_calls)
    is_auto = tool_choice == "auto"
    single_call = parallel_tool_calls is False
    output_format = own_format if is_auto else None
    if is_auto and structured and output_format is None:
        return None  # vLLM: xgrammar cannot mix that kind in; the request's own applies
    level = parser.default_tool_strict_level
    chosen = tag_tools(tools, tool_choice, single_call, output_format is not None, level)
    if chosen is None:
        return own
    # "auto" allows plain text; mixed with a structured output the calls are "required" so
    # the output branch stays meaningful (as vLLM does).
    tag = parser.structural_tag(
        chosen, "required" if output_format is not None else tool_choice, single_call
    )
    if tag is None:
        return own
    if output_format is not None:
        tag = structural_tag(or_format([tag["format"], output_format]))
    return {"structural_tag": json.dumps(tag)}


def _generic_json(
    tools: list[dict[str, Any]], tool_choice: ToolChoice, parallel_tool_calls: bool | None
) -> dict[str, Any] | None:
    """vLLM's ``get_json_schema_from_tools``: the named tool's parameters, or for
    ``required`` an array of calls to any of the tools."""
    if (name := named_tool(tool_choice)) is not None:
        for tool in tools:
            if tool_function(tool).get("name") == name:
                return {"json": tool_function(tool).get("parameters") or _EMPTY_OBJECT}
        return None
    if tool_choice != "required":
        return None
    return {"json": _required_schema(tools, parallel_tool_calls)}


_EMPTY_OBJECT: dict[str, Any] = {"type": "object", "properties": {}}


def _required_schema(tools: list[dict[str, Any]], parallel_tool_calls: bool | None) -> dict:
    calls, defs = [], {}
    for tool in tools:
        function = tool_function(tool)
        params = dict(function.get("parameters") or {})
        # Each tool's $defs move to the top, where the array's references resolve.
        defs.update(params.pop("$defs", None) or {})
        calls.append(
            {
                "properties": {
                    "name": {"type": "string", "enum": [function.get("name")]},
                    "parameters": params or _EMPTY_OBJECT,
                },
                "required": ["name", "parameters"],
            }
        )
    schema: dict[str, Any] = {
        "type": "array",
        "minItems": 1,
        "items": {"type": "object", "anyOf": calls},
    }
    if parallel_tool_calls is False:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema
