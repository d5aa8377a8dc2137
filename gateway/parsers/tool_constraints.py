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
"""

from __future__ import annotations

import json
from typing import Any

from gateway.parsers.base import ToolParser

ToolChoice = str | dict[str, Any]


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
    tools: list[dict[str, Any]], tool_choice: ToolChoice, single_call: bool, auto_with_format: bool
) -> list[dict[str, Any]] | None:
    """The tools a structural tag covers, each with ``strict`` pinned (vLLM's
    ``resolve_tool_strictness`` at the default ``--tool-strict-level auto``); None: no tag."""
    # Limiting the call count needs the call envelope in the grammar (vLLM raises the strict
    # level to "function" then), except for auto with a structured output.
    envelope_forced = single_call and not auto_with_format
    if tool_choice == "auto" and not envelope_forced and not any(map(_is_strict, tools)):
        return None
    name = named_tool(tool_choice)
    chosen = [t for t in tools if name is None or tool_function(t).get("name") == name]
    return [
        {**tool, "function": {**tool_function(tool), "strict": _is_strict(tool)}} for tool in chosen
    ]


def arguments_schema(tool: dict[str, Any]) -> Any:
    """What a tag lets the arguments be: the parameters schema when strict, else any JSON."""
    function = tool_function(tool)
    return (function.get("strict") and function.get("parameters")) or True


def json_schema_format(schema: Any) -> dict[str, Any]:
    return {
        "type": "json_schema",
        "json_schema": schema,
        "style": "json",
        "any_order": False,
        "max_whitespace_cnt": None,
        "excludes": [],
    }


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
        return {"type": "or", "elements": [{"type": "const_string", "value": c} for c in choices]}
    return None


def tool_structured_outputs(
    parser: ToolParser,
    tools: list[dict[str, Any]],
    tool_choice: ToolChoice,
    parallel_tool_calls: bool | None,
    structured: dict[str, Any] | None,
) -> dict[str, Any] | None:
    """The ``structured_outputs`` the request is sent with instead of its own; None keeps the
    request's own (``structured``: its structured output as vLLM's field names spell it)."""
    if tool_choice == "none" or not tools:
        return None
    if not parser.native_required_and_named:
        return _generic_json(tools, tool_choice, parallel_tool_calls)
    is_auto = tool_choice == "auto"
    single_call = parallel_tool_calls is False
    output_format = _output_format(structured) if is_auto and structured else None
    if is_auto and structured and output_format is None:
        return None  # vLLM: xgrammar cannot mix that kind in; the request's own applies
    chosen = tag_tools(tools, tool_choice, single_call, output_format is not None)
    if chosen is None:
        return None
    # "auto" allows plain text; mixed with a structured output the calls are "required" so
    # the output branch stays meaningful (as vLLM does).
    tag = parser.structural_tag(
        chosen, "required" if output_format is not None else tool_choice, single_call
    )
    if tag is None:
        return None
    if output_format is not None:
        tag = {
            "type": "structural_tag",
            "format": {"type": "or", "elements": [tag["format"], output_format]},
        }
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
