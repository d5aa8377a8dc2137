"""Chat stream deltas -> the Responses stream: vLLM 0.32's SimpleStreamingEventProcessor.

Each delta is split into its reasoning, its content and its tool calls (one per call index),
in that order; a delta of another kind than the open item closes that item and opens one of
its kind (a tool call of another index closes the call before it). A text item (reasoning or
message) is output_item.added, content_part.added, its deltas, then *.done,
content_part.done, output_item.done; a function call has no content part. Every event has a
sequence_number counting from 0 across the stream; the items closed are the final
response's output, ids and all.
"""

from __future__ import annotations

from enum import Enum, auto
from typing import Any

from gateway.api.responses.output import (
    function_call_item,
    message_item,
    output_text,
    random_id,
    reasoning_item,
    stream_logprobs,
)

Event = dict[str, Any]


class _Kind(Enum):
    NONE = auto()
    CONTENT = auto()
    REASONING = auto()
    TOOL_CALL = auto()


def split_delta(delta: dict[str, Any]) -> list[dict[str, Any]]:
    """vLLM's split_delta on a chat delta dict (reasoning, content, tool calls by index)."""
    calls = delta.get("tool_calls") or []
    parts = ("reasoning" in delta) + ("content" in delta) + bool(calls)
    if parts <= 1 and len({c.get("index") for c in calls}) <= 1:
        return [delta]
    out: list[dict[str, Any]] = []
    if "reasoning" in delta:
        out.append({"reasoning": delta["reasoning"]})
    if "content" in delta:
        out.append({"content": delta["content"]})
    groups: dict[Any, list[dict[str, Any]]] = {}
    for call in calls:
        groups.setdefault(call.get("index"), []).append(call)
    out.extend({"tool_calls": group} for group in groups.values())
    return out


class StreamEvents:
    """The event sequence of one streamed response, built delta by delta."""

    def __init__(self) -> None:
        self.sequence = 0
        self.output: list[dict] = []  # the items done, in order
        self._kind = _Kind.NONE
        self._index = 0  # the open item's output_index
        self._id = ""
        self._text = ""
        self._logprobs: list[dict] = []
        self._call: dict[str, Any] = {}

    def _numbered(self, event: Event) -> Event:
        event["sequence_number"] = self.sequence
        self.sequence += 1
        return event

    def started(self, response: dict) -> list[Event]:
        """response.created and response.in_progress (the response without output)."""
        return [
            self._numbered({"response": response, "type": "response.created"}),
            self._numbered({"response": response, "type": "response.in_progress"}),
        ]

    def delta(self, delta: dict[str, Any], logprobs: list[dict] | None = None) -> list[Event]:
        """The events of one chat delta; `logprobs`: its tokens' entries (chat's shape), which
        vLLM attaches to the content it carries."""
        events: list[Event] = []
        for part in split_delta(delta):
            kind, call = _kind_of(part)
            if kind is _Kind.NONE:
                continue
            if self._transition(kind, call):
                events += self.close()
                events += self._open(kind, call)
            events += self._emit(part, logprobs or [])
        return events

    def completed(self, response: dict) -> list[Event]:
        """The open item's closing events, then response.completed (the last event, whatever
        the status)."""
        events = self.close()
        events.append(self._numbered({"response": response, "type": "response.completed"}))
        return events

    def _transition(self, kind: _Kind, call: dict | None) -> bool:
        if self._kind is not kind:
            return True
        if kind is not _Kind.TOOL_CALL or call is None:
            return False
        before, now = self._call.get("index"), call.get("index")
        return before is not None and now is not None and before != now

    def _open(self, kind: _Kind, call: dict | None) -> list[Event]:
        self._kind, self._text, self._logprobs = kind, "", []
        at = {"output_index": self._index}
        if kind is _Kind.TOOL_CALL:
            assert call is not None
            self._id = random_id("fc")
            name = (call.get("function") or {}).get("name")
            call_id = call.get("id") or random_id("chatcmpl-tool").replace("_", "-")
            self._call = {"index": call.get("index"), "name": name, "call_id": call_id}
            item = function_call_item(name, "", call_id, "in_progress", self._id)
            return [self._numbered({"item": item, **at, "type": "response.output_item.added"})]
        self._call = {}
        if kind is _Kind.REASONING:
            self._id = random_id("rs")
            item = {**reasoning_item("", "in_progress", self._id), "content": None}
            part: dict = {"text": "", "type": "reasoning_text"}
        else:
            self._id = random_id("msg")
            item = message_item([], "in_progress", self._id)
            part = output_text("", [])
        return [
            self._numbered({"item": item, **at, "type": "response.output_item.added"}),
            self._numbered(
                {
                    "content_index": 0,
                    "item_id": self._id,
                    **at,
                    "part": part,
                    "type": "response.content_part.added",
                }
            ),
        ]

    def _emit(self, part: dict[str, Any], logprobs: list[dict]) -> list[Event]:
        at = {"item_id": self._id, "output_index": self._index}
        if self._kind is _Kind.TOOL_CALL:
            arguments = "".join(
                (c.get("function") or {}).get("arguments") or "" for c in part["tool_calls"]
            )
            if not arguments:
                return []
            self._text += arguments
            event = {"delta": arguments, **at, "type": "response.function_call_arguments.delta"}
            return [self._numbered(event)]
        if self._kind is _Kind.REASONING:
            self._text += part["reasoning"]
            event = {
                "content_index": 0,
                "delta": part["reasoning"],
                **at,
                "type": "response.reasoning_text.delta",
            }
            return [self._numbered(event)]
        self._text += part["content"]
        self._logprobs += logprobs
        event = {
            "content_index": 0,
            "delta": part["content"],
            "item_id": self._id,
            "logprobs": stream_logprobs(logprobs),
            "output_index": self._index,
            "type": "response.output_text.delta",
        }
        return [self._numbered(event)]

    def close(self) -> list[Event]:
        """The open item's done events (none when no item is open)."""
        if self._kind is _Kind.NONE:
            return []
        at = {"item_id": self._id, "output_index": self._index}
        if self._kind is _Kind.TOOL_CALL:
            name, call_id = self._call["name"], self._call["call_id"]
            item = function_call_item(name, self._text, call_id, "completed", self._id)
            events = [
                {
                    "arguments": self._text,
                    **at,
                    "type": "response.function_call_arguments.done",
                    "name": name,
                }
            ]
        elif self._kind is _Kind.REASONING:
            part = {"text": self._text, "type": "reasoning_text"}
            item = reasoning_item(self._text, "completed", self._id)
            events = [
                {
                    "content_index": 0,
                    **at,
                    "text": self._text,
                    "type": "response.reasoning_text.done",
                },
                {"content_index": 0, **at, "part": part, "type": "response.content_part.done"},
            ]
        else:
            part = output_text(self._text, self._logprobs or None)
            item = message_item([part] if self._text else [], "completed", self._id)
            events = [
                {
                    "content_index": 0,
                    **at,
                    "logprobs": [],
                    "text": self._text,
                    "type": "response.output_text.done",
                },
                {"content_index": 0, **at, "part": part, "type": "response.content_part.done"},
            ]
        events.append(
            {"item": item, "output_index": self._index, "type": "response.output_item.done"}
        )
        self.output.append(item)
        self._index += 1
        self._kind = _Kind.NONE
        return [self._numbered(e) for e in events]


def _kind_of(delta: dict[str, Any]) -> tuple[_Kind, dict | None]:
    """vLLM's resolve_target_state: a tool call (with a function), else reasoning (even
    empty), else content (only when not empty)."""
    calls = delta.get("tool_calls")
    if calls and "function" in calls[0]:
        return _Kind.TOOL_CALL, calls[0]
    if delta.get("reasoning") is not None:
        return _Kind.REASONING, None
    if delta.get("content"):
        return _Kind.CONTENT, None
    return _Kind.NONE, None
