"""A chat result -> the Response object: vLLM 0.32's build_response_output_items and
ResponsesResponse.from_request for non-harmony models, field for field (a client reading the
JSON sees what vLLM's server writes, the openai SDK's optional fields included as null).

Output items come in vLLM's order: the reasoning, the message (its text, with the logprobs of
every generated token when `include` asks for them), then one function_call per tool call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.api.responses.protocol import ResponsesRequest, random_id

# The openai SDK's FunctionTool fields, as vLLM echoes a request's tools.
_TOOL_FIELDS = (
    "name", "parameters", "strict", "type", "allowed_callers", "async", "defer_loading",
    "description", "output_schema",
)  # fmt: skip


@dataclass(frozen=True)
class Echo:
    """The sampling values a response reports: what the engine was given (the request's
    values, else the model's generation config, else OpenAI's defaults)."""

    temperature: float
    top_p: float
    presence_penalty: float
    frequency_penalty: float
    max_output_tokens: int | None


def reasoning_item(text: str, status: str | None = None, item_id: str | None = None) -> dict:
    return {
        "id": item_id or random_id("rs"),
        "summary": [],
        "type": "reasoning",
        "content": [{"text": text, "type": "reasoning_text"}],
        "encrypted_content": None,
        "status": status,
    }


def output_text(text: str, logprobs: list[dict] | None) -> dict:
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs}


def message_item(content: list[dict], status: str, item_id: str | None = None) -> dict:
    return {
        "id": item_id or random_id("msg"),
        "content": content,
        "role": "assistant",
        "status": status,
        "type": "message",
        "phase": None,
    }


def function_call_item(
    name: str, arguments: str, call_id: str, status: str, item_id: str | None = None
) -> dict:
    return {
        "arguments": arguments,
        "call_id": call_id,
        "name": name,
        "type": "function_call",
        "id": item_id or random_id("fc"),
        "async": None,
        "caller": None,
        "namespace": None,
        "status": status,
    }


def output_items(message: dict, logprobs: list[dict] | None, parsed: bool) -> list[dict]:
    """A chat completion's message as output items. `parsed`: a reasoning or tool parser
    ran (without one vLLM always writes the message, empty or not)."""
    text = message.get("content") or ""
    if not parsed:
        return [message_item([output_text(text, logprobs)] if text else [], "completed")]
    items = []
    if message.get("reasoning"):
        items.append(reasoning_item(message["reasoning"]))
    if text:
        items.append(message_item([output_text(text, logprobs)], "completed"))
    for call in message.get("tool_calls") or []:
        function = call["function"]
        items.append(
            function_call_item(function["name"], function["arguments"], call["id"], "completed")
        )
    return items


def response_logprobs(chat_logprobs: dict | None) -> list[dict] | None:
    """Chat's logprobs entries are the Response's (token, logprob, bytes, top_logprobs)."""
    if chat_logprobs is None:
        return None
    return chat_logprobs.get("content")


def stream_logprobs(entries: list[dict]) -> list[dict]:
    """A delta event's logprobs: without bytes (the SDK's response_text_delta_event)."""
    return [
        {
            "token": e["token"],
            "logprob": e["logprob"],
            "top_logprobs": [
                {"token": t["token"], "logprob": t["logprob"]} for t in e["top_logprobs"]
            ],
        }
        for e in entries
    ]


def usage(chat_usage: dict) -> dict:
    details = chat_usage.get("completion_tokens_details") or {}
    prompt = chat_usage.get("prompt_tokens_details") or {}
    return {
        "input_tokens": chat_usage["prompt_tokens"],
        "input_tokens_details": {
            "cached_tokens": prompt.get("cached_tokens") or 0,
            # Not known here (the engine does not report it over the wire).
            "cache_write_tokens": 0,
            "input_tokens_per_turn": [],
            "cached_tokens_per_turn": [],
        },
        "output_tokens": chat_usage["completion_tokens"],
        "output_tokens_details": {
            "reasoning_tokens": details.get("reasoning_tokens", 0),
            "tool_output_tokens": 0,
            "output_tokens_per_turn": [],
            "tool_output_tokens_per_turn": [],
        },
        "total_tokens": chat_usage["total_tokens"],
    }


def status_of(finish_reason: str | None) -> str:
    """vLLM: a reply cut by max_output_tokens is incomplete; everything else completed."""
    return "incomplete" if finish_reason == "length" else "completed"


def response_object(
    request: ResponsesRequest,
    *,
    model: str,
    created_at: int,
    echo: Echo,
    output: list[dict],
    status: str,
    usage: dict | None = None,
    kv_transfer_params: dict | None = None,
) -> dict:
    """The Response as vLLM's ResponsesResponse.from_request dumps it."""
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {
        "id": request.request_id,
        "created_at": created_at,
        "incomplete_details": incomplete,
        "instructions": request.instructions,
        "metadata": request.metadata,
        "model": model,
        "object": "response",
        "output": output,
        "parallel_tool_calls": request.parallel_tool_calls
        if request.parallel_tool_calls is not None
        else True,
        "temperature": echo.temperature,
        "tool_choice": _tool_choice(request.tool_choice),
        "tools": [_tool(t) for t in request.tools],
        "top_p": echo.top_p,
        "background": request.background,
        "max_output_tokens": echo.max_output_tokens,
        "max_tool_calls": request.max_tool_calls,
        "previous_response_id": request.previous_response_id,
        "prompt": None,
        "reasoning": _reasoning(request),
        "service_tier": request.service_tier,
        "status": status,
        "text": _text(request),
        "top_logprobs": request.top_logprobs if request.include_logprobs() else None,
        "truncation": request.truncation,
        "usage": usage,
        "user": request.user,
        "presence_penalty": echo.presence_penalty,
        "frequency_penalty": echo.frequency_penalty,
        "kv_transfer_params": kv_transfer_params,
        "ec_transfer_params": None,
        "input_messages": None,
        "output_messages": None,
    }


def _tool(tool: dict[str, Any]) -> dict[str, Any]:
    out = {name: tool.get(name) for name in _TOOL_FIELDS}
    out.update((k, v) for k, v in tool.items() if k not in out)
    return out


def _tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, dict):
        return {"name": choice.get("name"), "type": choice.get("type")}
    return choice


def _reasoning(request: ResponsesRequest) -> dict | None:
    if request.reasoning is None:
        return None
    fields = ("context", "effort", "generate_summary", "mode", "summary")
    given = request.reasoning.model_dump()
    return {**{name: given.get(name) for name in fields}, **given}


def _text(request: ResponsesRequest) -> dict | None:
    if request.text is None:
        return None
    fmt = request.text.format
    out: dict[str, Any] = {"format": None, "verbosity": request.text.verbosity}
    if fmt is None:
        return out
    if fmt.type == "json_schema":
        out["format"] = {
            "name": fmt.name,
            "schema": fmt.json_schema,
            "type": "json_schema",
            "description": fmt.description,
            "strict": fmt.strict,
        }
    else:
        out["format"] = {"type": fmt.type}
    return out
