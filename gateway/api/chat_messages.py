"""Parsed chat output as vLLM's server writes it: message fields, tool calls, stream deltas."""

from __future__ import annotations

from typing import Any

from gateway.parsers import DeltaMessage, DeltaToolCall, ToolCall

# The fields vLLM's ChatMessage always writes, null here.
VLLM_NULLS = {
    "refusal": None,
    "annotations": None,
    "audio": None,
    "function_call": None,
    "reasoning": None,
}


def tool_call_json(call: ToolCall) -> dict:
    return {
        "id": call.id,
        "type": call.type,
        "function": {"name": call.name, "arguments": call.arguments},
    }


def merged(messages: list[DeltaMessage | None]) -> DeltaMessage | None:
    """Several parsed deltas as one: texts joined, tool call pieces of one call joined."""
    out: DeltaMessage | None = None
    for message in messages:
        if message is None:
            continue
        if out is None:
            out = DeltaMessage()
        if message.content is not None:
            out.content = (out.content or "") + message.content
        if message.reasoning is not None:
            out.reasoning = (out.reasoning or "") + message.reasoning
        for call in message.tool_calls:
            last = out.tool_calls[-1] if out.tool_calls else None
            if last is None or last.index != call.index or call.id is not None:
                out.tool_calls.append(DeltaToolCall(**vars(call)))
            elif call.arguments is not None:
                last.arguments = (last.arguments or "") + call.arguments
    return out


def delta_json(message: DeltaMessage | None) -> dict:
    """A parsed delta as vLLM writes it: only the fields that are set."""
    if message is None:
        return {}
    out: dict[str, Any] = {}
    if message.content is not None:
        out["content"] = message.content
    if message.reasoning is not None:
        out["reasoning"] = message.reasoning
    if message.tool_calls:
        out["tool_calls"] = [_tool_calldelta_json(c) for c in message.tool_calls]
    return out


def _tool_calldelta_json(call: Any) -> dict:
    out: dict[str, Any] = {}
    if call.id is not None:
        out["id"] = call.id
    if call.type is not None:
        out["type"] = call.type
    out["index"] = call.index
    function = {}
    if call.name is not None:
        function["name"] = call.name
    if call.arguments is not None:
        function["arguments"] = call.arguments
    if function or call.name is not None:
        out["function"] = function
    return out
