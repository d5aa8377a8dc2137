"""A chat completion as a Message, as vLLM's `messages_full_converter` makes it: a thinking
block (the reasoning), a text block (the content), a tool_use block per tool call, in that
order; one empty text block when there is nothing."""

from __future__ import annotations

import json
import uuid
from typing import Any, Literal

from gateway.errors import GatewayError

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]
NOT_AN_OBJECT = "the model's tool call arguments are not a JSON object: {}"


def stop_reason(
    finish_reason: str | None, matched: int | str | None, tool_used: bool, tool_complete: bool
) -> tuple[StopReason | None, str | None]:
    """Anthropic's (stop_reason, stop_sequence), first match wins: the length cut, complete
    tool calls (also for a named tool, where chat says "stop"), a matched stop string (chat's
    stop_reason when it is a string; a stop token id is not one), else the end of the turn. A
    stop string that cut a tool call short wins over it: such a call must not run."""
    if finish_reason == "length":
        return "max_tokens", None
    if finish_reason not in ("stop", "tool_calls"):
        return None, None
    if tool_complete:
        return "tool_use", None
    if isinstance(matched, str):
        return "stop_sequence", matched
    if finish_reason == "tool_calls" or tool_used:
        return "tool_use", None
    return "end_turn", None


def usage(chat_usage: dict[str, Any] | None) -> dict[str, int]:
    """Anthropic's usage from chat's. vLLM's server (without --enable-prompt-tokens-details)
    reports no cache split, and input_tokens is the whole prompt; so here, whatever the prefix
    cache held, and input_tokens equals count_tokens' answer."""
    if chat_usage is None:
        return {"input_tokens": 0, "output_tokens": 0}
    return {
        "input_tokens": chat_usage["prompt_tokens"],
        "output_tokens": chat_usage.get("completion_tokens") or 0,
    }


def signature() -> str:
    """A thinking block's signature: vLLM's is a random hex uuid (nothing checks it)."""
    return uuid.uuid4().hex


def to_message(completion: dict[str, Any]) -> dict[str, Any]:
    """The Message for a chat.completion dict (`ChatRun.complete()`), as vLLM writes it (its
    fields that are null left out)."""
    choice = completion["choices"][0]
    message = choice["message"]
    calls = message.get("tool_calls") or []
    reason, sequence = stop_reason(
        choice["finish_reason"], choice.get("stop_reason"), bool(calls), bool(calls)
    )
    content: list[dict[str, Any]] = []
    if message.get("reasoning"):
        content.append(
            {"type": "thinking", "thinking": message["reasoning"], "signature": signature()}
        )
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in calls:
        arguments = json.loads(call["function"]["arguments"])
        if not isinstance(arguments, dict):
            # vLLM answers this (a forced call of a tool that is not strict) with a 400 too.
            raise GatewayError(NOT_AN_OBJECT.format(call["function"]["arguments"]), 400)
        function = call["function"]
        content.append(
            {"type": "tool_use", "id": call["id"], "name": function["name"], "input": arguments}
        )
    out: dict[str, Any] = {
        "id": completion["id"],
        "type": "message",
        "role": "assistant",
        "content": content or [{"type": "text", "text": ""}],
        "model": completion["model"],
        "stop_reason": reason,
        "usage": usage(completion.get("usage")),
    }
    if sequence is not None:
        out["stop_sequence"] = sequence
    if completion.get("kv_transfer_params") is not None:
        out["kv_transfer_params"] = completion["kv_transfer_params"]
    return out
