"""Responses input (a string or items) and instructions -> chat messages: vLLM's
construct_input_messages and _construct_message_from_response_item for non-harmony models.

Items of one assistant turn merge into one message as vLLM merges them: a reasoning item, an
assistant message and function calls that follow one another become one assistant message
(reasoning, content, tool_calls), which is what a chat template renders as one turn. The same
conversion turns a stored response's output items back into messages, so a continuation
replays them (`history_messages`).

The messages are the gateway's chat messages: an `input_image` part becomes an `image_url`
part (vLLM's chat parser reads both alike) so images take chat's fetch, SSRF and
preprocessing path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.api.responses.protocol import random_id
from gateway.errors import GatewayError

Message = dict[str, Any]
ROLES = frozenset({"user", "assistant", "system", "developer"})
_ITEM_ID_PREFIX = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "reasoning": "rs",
}


def input_messages(
    instructions: str | None, input: str | list[dict[str, Any]], history: Sequence[Message] = ()
) -> list[Message]:
    """The chat messages of a turn: the instructions as system, the earlier turns' messages
    (`history`, without system messages: instructions do not carry over), the new input."""
    messages: list[Message] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    messages.extend(m for m in history if m.get("role") != "system")
    if isinstance(input, str):
        messages.append({"role": "user", "content": input})
    else:
        messages.extend(to_messages(input))
    return messages


def to_messages(items: Sequence[Any]) -> list[Message]:
    """Response items (input items, or a response's output items) as chat messages."""
    messages: list[Message] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise _bad(f"input[{i}] must be an object")
        previous = messages[-1] if messages else None
        message = _message(i, item, previous if _is_assistant(previous) else None)
        if message is not None:
            messages.append(message)
    return messages


def continues_final_message(input: str | list[dict[str, Any]]) -> bool:
    """vLLM's should_continue_final_message: a last assistant message or reasoning item
    that is in progress or incomplete is continued, not answered."""
    if isinstance(input, str) or not input:
        return False
    last = input[-1]
    if not isinstance(last, dict) or last.get("type", "message") not in ("message", "reasoning"):
        return False
    return last.get("status") in ("in_progress", "incomplete")


def listed_items(input: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The input as GET /v1/responses/{id}/input_items lists it: items with ids (a string
    input is one user message)."""
    if isinstance(input, str):
        text = {"type": "input_text", "text": input}
        items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": [text]}]
    else:
        items = [dict(item) for item in input]
    for item in items:
        if "id" not in item:
            item["id"] = random_id(_ITEM_ID_PREFIX.get(item.get("type", "message"), "item"))
    return items


def _is_assistant(message: Message | None) -> bool:
    return message is not None and message.get("role") == "assistant"


def _message(i: int, item: dict[str, Any], assistant: Message | None) -> Message | None:
    """One item as a new message, or None when it merged into `assistant` (the message
    before it, when that is an assistant message)."""
    kind = item.get("type")
    if kind == "function_call":
        call = _tool_call(i, item)
        if assistant is not None:
            assistant.setdefault("tool_calls", []).append(call)
            return None
        return {"role": "assistant", "tool_calls": [call]}
    if kind == "reasoning":
        reasoning = _reasoning(i, item)
        if assistant is not None and assistant.get("reasoning") is None:
            assistant["reasoning"] = reasoning
            return None
        return {"role": "assistant", "reasoning": reasoning}
    if kind == "function_call_output":
        return {"role": "tool", "content": item.get("output"), "tool_call_id": item.get("call_id")}
    if kind in (None, "message") and "role" in item:
        return _role_message(i, item, assistant)
    raise _bad(f"Unsupported input item type: {kind}")


def _role_message(i: int, item: dict[str, Any], assistant: Message | None) -> Message | None:
    role, content = item["role"], item.get("content")
    if role not in ROLES:
        raise _bad(f"input[{i}].role must be one of {sorted(ROLES)}, not {role!r}")
    if role == "assistant":
        text = _assistant_text(i, content)
        if assistant is not None and assistant.get("content") is None:
            assistant["content"] = text
            return None
        return {"role": "assistant", "content": text}
    if isinstance(content, list):
        content = [_content_part(i, j, part) for j, part in enumerate(content)]
    elif not isinstance(content, str):
        raise _bad(f"input[{i}].content must be a string or a list")
    return {"role": role, "content": content}


def _assistant_text(i: int, content: Any) -> str:
    # vLLM keeps an assistant message's first part's text (an output message has one).
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content and isinstance(content[0], dict):
        text = content[0].get("text")
        if isinstance(text, str):
            return text
    raise _bad(f"input[{i}].content: an assistant message needs text")


def _content_part(i: int, j: int, part: Any) -> Any:
    if not isinstance(part, dict) or part.get("type") != "input_image":
        if isinstance(part, dict) and part.get("type") == "input_file":
            raise _bad(f"input[{i}].content[{j}]: input_file is not supported")
        return part
    url = part.get("image_url")
    if not isinstance(url, str) or not url:
        raise _bad(f"input[{i}].content[{j}].image_url is required (file_id is not supported)")
    # The part's other keys stay: vLLM shows them to an "openai"-format template, and it
    # gives a part without a detail the API's "auto".
    extra = {k: v for k, v in part.items() if k not in ("type", "image_url", "file_id")}
    return {"type": "image_url", "image_url": {"url": url}, "detail": "auto", **extra}


def _tool_call(i: int, item: dict[str, Any]) -> dict[str, Any]:
    fields = {k: item.get(k) for k in ("call_id", "name", "arguments")}
    if not all(isinstance(v, str) for v in fields.values()):
        raise _bad(f"input[{i}]: a function_call needs call_id, name and arguments strings")
    if item.get("namespace"):
        raise _bad(f"input[{i}]: namespaced tools are not supported")
    function = {"name": fields["name"], "arguments": fields["arguments"]}
    return {"id": fields["call_id"], "function": function, "type": "function"}


def _reasoning(i: int, item: dict[str, Any]) -> str:
    if item.get("encrypted_content"):
        raise _bad("Encrypted content is not supported.")
    content, summary = item.get("content"), item.get("summary")
    # What vLLM's ResponseReasoningItem takes; anything else it cannot read as reasoning.
    valid = isinstance(summary, list) and _typed_texts(summary, "summary_text")
    if not valid or (content is not None and not _typed_texts(content, "reasoning_text")):
        raise _bad("Unsupported input item type: reasoning")
    # vLLM reads the first content part, else the first summary part.
    for parts in (content, summary):
        if parts:
            return parts[0]["text"]
    return ""


def _typed_texts(parts: Any, kind: str) -> bool:
    return isinstance(parts, list) and all(
        isinstance(p, dict) and p.get("type") == kind and isinstance(p.get("text"), str)
        for p in parts
    )


def _bad(message: str) -> GatewayError:
    return GatewayError(message, 400, "input")
