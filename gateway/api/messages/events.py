"""Chat chunks as Anthropic's stream events, as vLLM's `message_stream_converter` writes them.

message_start (with the prompt's tokens), then per block content_block_start, its deltas
(text_delta, thinking_delta, input_json_delta; a thinking block ends with a signature_delta)
and content_block_stop, then message_delta (stop_reason, stop_sequence, usage) and
message_stop. One block is open at a time: a reasoning, text or tool-call delta of another kind
closes it and opens the next. Text that arrives while a tool_use block is open is held and
written as a text block of its own once that block closes.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from gateway.api.chat import Chunk
from gateway.api.messages.reply import signature, stop_reason, usage
from gateway.errors import error_body
from gateway.stream.sse import named


def error_event(message: str, status: int, param: str | None = None) -> str:
    """The error event that ends a failed stream, in Anthropic's shape, typed as a refusal
    before the stream would be (BadRequestError, ...) with the gateway's own message. vLLM
    writes "internal_error" and pydantic's complaint about the chat error chunk it could not
    read as a chunk."""
    return named("error", anthropic_error(message, status, param))


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


class MessageEvents:
    """The state of one streamed message: the open block, the tool calls, the stop."""

    def __init__(self, message_id: str, model: str) -> None:
        self.id, self.model = message_id, model
        self.index = 0  # of the next block
        self.kind: str | None = None  # the open block's type
        self.signed = True  # whether the open block needs no signature_delta
        self.tool_id: str | None = None  # the open tool_use block's call
        self.pending: list[str] = []  # text that arrived inside a tool_use block
        self.tool_ids: dict[int, str] = {}  # chat's tool call index -> call id
        self.tool_used = False
        self.last_arguments: list[str] = []  # the latest call's, to tell it complete
        self.finish_reason: str | None = None
        self.matched: int | str | None = None

    def start(self, input_tokens: int) -> str:
        message = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": self.model,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": 0},
        }
        return named("message_start", {"type": "message_start", "message": message})

    def chunk(self, choices: list[dict], chat_usage: dict | None) -> list[str]:
        if not choices:  # the usage chunk, last
            return [*self._flush(), self._message_delta(chat_usage)]
        entry = choices[0]
        if entry.get("finish_reason") is not None:
            self.finish_reason = entry["finish_reason"]
            self.matched = entry.get("stop_reason")
        delta = entry.get("delta") or {}
        events: list[str] = []
        if reasoning := delta.get("reasoning"):
            if self.kind != "thinking":
                events += self._flush()
                events.append(self._open({"type": "thinking", "thinking": ""}))
            events.append(self._delta({"type": "thinking_delta", "thinking": reasoning}))
        if content := delta.get("content"):
            if self.kind == "tool_use":
                self.pending.append(content)
            else:
                if self.kind != "text":
                    events += self._flush()
                    events.append(self._open({"type": "text", "text": ""}))
                events.append(self._delta({"type": "text_delta", "text": content}))
        for call in delta.get("tool_calls") or ():
            events += self._tool_call(call)
        return events

    def stop(self) -> list[str]:
        return [*self._flush(), named("message_stop", {"type": "message_stop"})]

    def _tool_call(self, call: dict) -> list[str]:
        events: list[str] = []
        function = call.get("function") or {}
        arguments = function.get("arguments")
        if call.get("id") is not None:
            self.tool_ids[call["index"]] = call["id"]
            name = function.get("name")
            if self.tool_id != call["id"] and name is not None:
                events += self._flush()
                self.tool_used = True
                self.last_arguments = []
                block = {"type": "tool_use", "id": call["id"], "name": name, "input": {}}
                events.append(self._open(block))
            call_id = call["id"]
        else:
            call_id = self.tool_ids.get(call["index"])
        if arguments and call_id is not None and self.tool_id == call_id:
            self.last_arguments.append(arguments)
            events.append(self._delta({"type": "input_json_delta", "partial_json": arguments}))
        return events

    def _open(self, block: dict) -> str:
        self.kind = block["type"]
        self.signed = block["type"] != "thinking"
        self.tool_id = block.get("id") if block["type"] == "tool_use" else None
        body = {"type": "content_block_start", "content_block": block, "index": self.index}
        return named("content_block_start", body)

    def _delta(self, delta: dict) -> str:
        body = {"type": "content_block_delta", "delta": delta, "index": self.index}
        return named("content_block_delta", body)

    def _close(self) -> list[str]:
        if self.kind is None:
            return []
        events = []
        if not self.signed:
            events.append(self._delta({"type": "signature_delta", "signature": signature()}))
        events.append(
            named("content_block_stop", {"type": "content_block_stop", "index": self.index})
        )
        self.kind, self.signed, self.tool_id = None, True, None
        self.index += 1
        return events

    def _flush(self) -> list[str]:
        """Close the open block, then write the text held while it was a tool_use block."""
        held, self.pending = "".join(self.pending), []
        events = self._close()
        if held:
            events.append(self._open({"type": "text", "text": ""}))
            events.append(self._delta({"type": "text_delta", "text": held}))
            events += self._close()
        return events

    def _message_delta(self, chat_usage: dict | None) -> str:
        complete = self.tool_used and _is_json("".join(self.last_arguments))
        reason, sequence = stop_reason(
            self.finish_reason or "stop", self.matched, self.tool_used, complete
        )
        body = {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": usage(chat_usage),
        }
        return named("message_delta", body)


async def message_events(
    chunks: AsyncIterator[Chunk], message_id: str, model: str, input_tokens: Callable[[], int]
) -> AsyncIterator[str]:
    """The events of a chat run's chunks. The first chunk (chat's role chunk) carries nothing
    else; message_start is written with the next one, once the worker has answered, so that
    `input_tokens` is the prompt's length as the worker counted it (a worker that preprocesses
    images expands the prompt itself)."""
    state = MessageEvents(message_id, model)
    seen = 0
    async for choices, chat_usage in chunks:
        seen += 1
        if seen == 1:
            continue
        events = state.chunk(choices, chat_usage)
        if seen == 2:
            events.insert(0, state.start(input_tokens()))
        if events:
            yield "".join(events)
    yield "".join(([state.start(input_tokens())] if seen < 2 else []) + state.stop())


def anthropic_error(message: str, status: int, param: str | None = None) -> dict[str, Any]:
    """Anthropic's error body; its type is the one the OpenAI body would have (as vLLM)."""
    kind = error_body(message, status, param)["error"]["type"]
    return {"type": "error", "error": {"type": kind, "message": message}}
