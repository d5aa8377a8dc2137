"""A Messages request as the chat request vLLM makes of it (`AnthropicServingMessages.
to_chat_completion_request`): system text first, blocks to chat content parts, tool_use to
tool calls, tool_result to tool messages, thinking to reasoning, Anthropic's tool_choice and
sampling fields to chat's."""

from __future__ import annotations

import json
import time
from typing import Any, Literal

from gateway.api.messages.protocol import (
    BILLING_HEADER,
    TOOL_CHANGES,
    ContentBlock,
    Message,
    MessagesRequest,
    PromptFields,
    ThinkingEnabled,
    Tool,
    ToolChangeDefinition,
)
from gateway.api.protocol import ChatCompletionRequest
from gateway.errors import GatewayError, parse_body

# What thinking {"type": "disabled"} sends as reasoning_effort: "none" unless the template
# cannot tell it from a thinking effort (`service.disabled_thinking_effort`).
DisabledEffort = Literal["none", "low"]


def to_chat_request(
    request: PromptFields,
    *,
    merge_inline_system: bool = False,
    disabled_effort: DisabledEffort = "none",
) -> ChatCompletionRequest:
    """The chat request for a create (MessagesRequest) or a count_tokens request, checked as
    /v1/chat/completions checks one (a 400 naming the field)."""
    messages = system_messages(request, merge_inline_system)
    messages += chat_messages(request.messages, merge_inline_system)
    fields: dict[str, Any] = {"model": request.model, "messages": messages}
    if isinstance(request, MessagesRequest):
        fields.update(_sampling(request))
    if request.chat_template_kwargs is not None:
        fields["chat_template_kwargs"] = request.chat_template_kwargs
    output = request.output_config
    if output is not None and output.format is not None and output.format.json_schema:
        fields["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "json_schema", "schema": output.format.json_schema},
        }
    if output is not None and output.effort is not None:
        fields["reasoning_effort"] = output.effort
    thinking = request.thinking
    if thinking is not None and thinking.type == "disabled":
        fields["reasoning_effort"] = disabled_effort
    elif isinstance(thinking, ThinkingEnabled):
        fields["thinking_token_budget"] = thinking.budget_tokens  # vLLM's _handle_thinking
    fields.update(_tools(request))
    return parse_body(ChatCompletionRequest, fields)


def _sampling(request: MessagesRequest) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "max_tokens": request.max_tokens,
        "max_completion_tokens": request.max_tokens,
        "stop": request.stop_sequences,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "top_k": request.top_k,
        "watermarking": request.watermarking,
        "cache_salt": request.cache_salt,
        "kv_transfer_params": request.kv_transfer_params,
        "ec_transfer_params": request.ec_transfer_params,
        "vllm_xargs": request.vllm_xargs,
    }
    fields = {name: value for name, value in fields.items() if value is not None}
    if request.stream:
        # The final chunk's usage is message_delta's; message_start reads the run's prompt
        # length itself (vLLM asks for continuous usage only to read it off the first chunk).
        fields.update(stream=True, stream_options={"include_usage": True})
    return fields


def system_messages(request: PromptFields, merge_inline_system: bool) -> list[dict[str, Any]]:
    """The top-level system text (and, for templates that want system first, the inline
    system messages' text), joined into one leading system message."""
    parts: list[str] = []
    if isinstance(request.system, str):
        if request.system:
            parts.append(request.system)
    elif request.system:
        # Claude Code's attribution header holds a per-request hash that defeats prefix caching.
        parts += [
            b.text
            for b in request.system
            if b.type == "text" and b.text and not b.text.startswith(BILLING_HEADER)
        ]
    if merge_inline_system:
        parts += [t for m in request.messages if m.role == "system" if (t := _system_text(m))]
    return [{"role": "system", "content": "".join(parts)}] if parts else []


def _system_text(message: Message) -> str | None:
    if isinstance(message.content, str):
        return None if message.content.startswith(BILLING_HEADER) else message.content
    parts = [
        b.text
        for b in message.content
        if b.type == "text" and b.text and not b.text.startswith(BILLING_HEADER)
    ]
    return "".join(parts) or None


def chat_messages(messages: list[Message], merge_inline_system: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "system":
            if not merge_inline_system and (text := _system_text(message)):
                out.append({"role": "system", "content": text})
            continue
        converted: dict[str, Any] = {"role": message.role}
        if isinstance(message.content, str):
            converted["content"] = message.content
        else:
            # tool_result blocks become tool messages, written before this message
            _convert_blocks(message, converted, out)
        # vLLM drops a user message left with no content (only tool results, say).
        if not (message.role == "user" and "content" not in converted):
            out.append(converted)
    return out


def _convert_blocks(message: Message, converted: dict[str, Any], out: list[dict]) -> None:
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for block in message.content:
        assert not isinstance(block, str)
        if block.type == "text" and block.text:
            parts.append({"type": "text", "text": block.text})
        elif block.type == "image" and block.source:
            parts.append({"type": "image_url", "image_url": {"url": image_url(block.source)}})
        elif block.type == "thinking" and block.thinking is not None:
            reasoning.append(block.thinking)
        elif block.type == "tool_use":
            calls.append(_tool_call(block))
        elif block.type == "tool_result":
            if message.role == "user":
                out += _tool_result_messages(block)
            else:
                text = str(block.content) if block.content else ""
                parts.append({"type": "text", "text": f"Tool result: {text}"})
        # redacted_thinking (opaque) and tool_reference blocks add nothing, as in vLLM
    if reasoning:
        converted["reasoning"] = "".join(reasoning)
    if calls:
        converted["tool_calls"] = calls
    if len(parts) == 1 and parts[0]["type"] == "text":
        converted["content"] = parts[0]["text"]
    elif parts:
        converted["content"] = parts


def image_url(source: dict[str, Any]) -> str:
    """An image source as a chat image URL: a url source as it is, anything else as base64
    data (vLLM's default when the type is missing)."""
    if source.get("type") == "url":
        return source.get("url", "")
    media_type = source.get("media_type", "image/jpeg")
    return f"data:{media_type};base64,{source.get('data', '')}"


def _tool_call(block: ContentBlock) -> dict[str, Any]:
    return {
        "id": block.id or f"call_{int(time.time())}",
        "type": "function",
        "function": {"name": block.name or "", "arguments": json.dumps(block.input or {})},
    }


def _tool_result_messages(block: ContentBlock) -> list[dict[str, Any]]:
    """A user's tool_result: a tool message with its text, then a user message with its
    images, then a tool message with its tool references (vLLM's order)."""
    text, images, references = "", [], []
    if isinstance(block.content, str):
        text = block.content
    elif isinstance(block.content, list):
        texts = []
        for item in block.content:
            if not isinstance(item, dict):
                continue
            kind = item.get("type")
            if kind == "text":
                texts.append(item.get("text", ""))
            elif kind == "image" and (url := image_url(item.get("source", {}))):
                images.append(url)
            elif kind == "tool_reference" and (name := item.get("tool_name") or item.get("name")):
                references.append({"type": "tool_reference", "name": name})
        text = "\n".join(texts)
    call_id = block.tool_use_id or ""
    out: list[dict[str, Any]] = [{"role": "tool", "tool_call_id": call_id, "content": text}]
    if images:
        parts = [{"type": "image_url", "image_url": {"url": url}} for url in images]
        out.append({"role": "user", "content": parts})
    if references:
        out.append({"role": "tool", "tool_call_id": call_id, "content": references})
    return out


def _tools(request: PromptFields) -> dict[str, Any]:
    """tools and tool_choice as chat's. Unlike vLLM, a tool_choice without tools is dropped
    (vLLM sets it after its checks; chat refuses it), and no tools ([]) is none."""
    fields: dict[str, Any] = {}
    choice = request.tool_choice
    if choice is not None:
        fields["parallel_tool_calls"] = not choice.disable_parallel_tool_use
    tools = resolve_tools(request)
    if not tools:
        return fields
    fields["tools"] = [_tool_json(tool) for tool in tools]
    if choice is None or choice.type == "auto":
        fields["tool_choice"] = "auto"
    elif choice.type == "any":
        fields["tool_choice"] = "required"
    elif choice.type == "none":
        fields["tool_choice"] = "none"
    else:
        fields["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    return fields


def _tool_json(tool: Tool) -> dict[str, Any]:
    # As vLLM's ChatCompletionToolsParam dumps it to the template: description always, strict
    # and defer_loading only when set.
    function: dict[str, Any] = {
        "name": tool.name,
        "description": tool.description,
        "parameters": tool.input_schema,
    }
    if tool.strict is not None:
        function["strict"] = tool.strict
    if tool.defer_loading is not None:
        function["defer_loading"] = tool.defer_loading
    return {"type": "function", "function": function}


def resolve_tools(request: PromptFields) -> list[Tool] | None:
    """The tools in effect at the conversation's end, tool_addition / tool_removal blocks in
    system messages applied (a template sees one list, as vLLM's `_resolve_tools`)."""
    changes = [
        block
        for message in request.messages
        if not isinstance(message.content, str)
        for block in message.content
        if block.type in TOOL_CHANGES
    ]
    if not changes:
        return request.tools
    tools = {tool.name: tool for tool in request.tools or []}
    removed: set[str] = set()
    for block in changes:
        change = block.tool
        assert change is not None
        if isinstance(change, ToolChangeDefinition):
            name = change.definition.name
            tools[name] = change.definition
        else:
            name = change.name
            if name not in tools:
                raise GatewayError(
                    f"{block.type} references tool {name!r}, which is not declared in tools",
                    400,
                    "messages",
                )
            if block.type == "tool_addition":
                tools[name] = tools[name].model_copy(update={"defer_loading": None})
        if block.type == "tool_removal":
            removed.add(name)
        else:
            removed.discard(name)
    return [tool for name, tool in tools.items() if name not in removed]
