"""Forced tool calls in vLLM 0.32's generic JSON format (``tool_choice`` "required" or named).

When the ``--tool-call-parser`` has no native format for forced calls (vLLM's
``supports_required_and_named=True``, e.g. ``pythonic``), vLLM constrains the engine with a JSON
schema instead and reads the output itself, bypassing the tool parser. Reproduced here:

- ``NamedCallParser`` (a ``{"type": "function", "function": {"name": ...}}`` choice): the output
  is the bare arguments object. Non-streaming (``vllm/parser/abstract_parser.py``
  ``DelegatingParser._extract_tool_calls``): one call whose arguments are the output verbatim
  (not validated nor re-serialised), or no call when the output is empty or whitespace.
  Streaming (``vllm/tool_parsers/streaming.py`` ``extract_named_tool_call_streaming``): the first
  delta carries id, name and its text as arguments, every later delta its text as arguments.
- ``RequiredCallsParser`` (``tool_choice="required"``): the output is a JSON array
  ``[{"name": ..., "parameters": {...}}, ...]``. Non-streaming: validated as vLLM's
  ``list[FunctionDefinition]`` with pydantic (same JSON reader, so the same NaN, big number,
  nesting and duplicate-key behaviour); arguments are ``json.dumps(parameters,
  ensure_ascii=False)`` (``"null"`` when missing). Anything that does not validate gives no call,
  and the text is dropped: content is always ``None``. Streaming
  (``extract_required_tool_call_streaming`` / ``_scan_required_tool_calls``): a string- and
  nesting-aware scan of the array; a call goes out (id, name, the ``parameters`` text so far)
  once its name string is closed and its ``parameters`` value has started, then the raw
  ``parameters`` text as it grows. Text after the array is ignored, and nothing is ever content.
  The scan checks less than the validator, so a stream can carry calls the non-streamed output
  rejects (text before the ``[``, ``parameters`` not an object, a cut-off array, and so on).

Neither class is in the registry: the chat service picks one by ``tool_choice``. In both paths
vLLM's ``finalize_generation`` adds nothing (the tool parser never saw the text), so ``finish``
sends nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from gateway.parsers.base import (
    DeltaMessage,
    DeltaToolCall,
    ToolCall,
    ToolCallResult,
    ToolParser,
    make_tool_call_id,
)


class _FunctionDefinition(BaseModel):
    """vLLM's ``FunctionDefinition`` (``vllm/entrypoints/generate/base/protocol.py``) as far as
    validation goes: a field of the wrong type (``"strict": "x"``, say) rejects the whole array
    there, so it must here too."""

    model_config = ConfigDict(extra="allow")

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    defer_loading: bool | None = None


_CALL_LIST = TypeAdapter(list[_FunctionDefinition])


class NamedCallParser(ToolParser):
    """The output of a request whose ``tool_choice`` names ``function_name``."""

    name = "named"

    def __init__(self, function_name: str) -> None:
        self.function_name = function_name
        self._name_sent = False

    def extract(self, text: str) -> ToolCallResult:
        if not text.strip():
            return ToolCallResult(False, [], None)
        return ToolCallResult(True, [ToolCall(name=self.function_name, arguments=text)], None)

    def feed(self, delta_text: str) -> DeltaMessage | None:
        if self._name_sent:
            # vLLM sends an empty arguments piece for an empty delta; that adds nothing.
            if not delta_text:
                return None
            return DeltaMessage(tool_calls=[DeltaToolCall(index=0, arguments=delta_text)])
        # No waiting for the JSON to start: even a whitespace-only first delta announces the
        # call (so a stream can carry a call the non-streamed output would not have).
        self._name_sent = True
        first = DeltaToolCall(
            index=0,
            id=make_tool_call_id(),
            type="function",
            name=self.function_name,
            arguments=delta_text,
        )
        return DeltaMessage(tool_calls=[first])


@dataclass
class _CallSpan:
    """Where one element of the array sits in the text (vLLM's ``_RequiredToolCallSpan``).

    ``name`` is set once its string is closed and decodes as JSON, ``name_end`` just past the
    closing quote; ``args_start``/``args_end`` delimit the ``parameters`` value (``args_end`` is
    None while it is still being generated). Offsets only ever get added as text arrives, so the
    spans after scanning a prefix are the spans of the full text truncated to it.
    """

    name: str | None = None
    name_end: int | None = None
    args_start: int | None = None
    args_end: int | None = None

    @property
    def ready(self) -> bool:
        return self.name is not None and self.args_start is not None

    def ready_at(self, length: int) -> bool:
        """Whether the first ``length`` characters already made this call streamable."""
        return (
            self.ready
            and self.name_end is not None
            and self.name_end <= length
            and self.args_start is not None
            and self.args_start < length
        )


# Parse states of one element object of the array (as in vLLM's scanner).
_EXPECT_KEY = 0
_EXPECT_COLON = 1
_EXPECT_VALUE = 2
_IN_STRING_VALUE = 3
_IN_CONTAINER_VALUE = 4
_IN_SCALAR_VALUE = 5
_AFTER_VALUE = 6


class _ArrayScanner:
    """vLLM's ``_scan_required_tool_calls`` made incremental.

    vLLM rescans the whole text on every delta; the scan is one left-to-right pass whose only
    look-backs are into text already seen, so resuming it where the last delta ended gives the
    same spans without the quadratic cost on long outputs.
    """

    def __init__(self) -> None:
        self.text = ""
        self.spans: list[_CallSpan] = []
        self._stopped = False  # vLLM's scan returned early: later text is ignored
        self._depth = 0  # nesting of {} and []; element objects sit at 2
        self._in_string = False
        self._escaped = False
        self._string_start = 0
        self._cur: _CallSpan | None = None
        self._expect = _EXPECT_KEY
        self._key: str | None = None
        self._value_start = 0

    def feed(self, chunk: str) -> None:
        start = len(self.text)
        self.text += chunk
        if self._stopped:
            return
        for i in range(start, len(self.text)):
            if not self._step(i, self.text[i]):
                self._stopped = True
                return

    def _step(self, i: int, ch: str) -> bool:
        """Consume character ``i``; False where vLLM's scan stops."""
        if self._in_string:
            self._string_char(i, ch)
        elif ch == '"':
            self._in_string = True
            self._string_start = i
            if self._at_element() and self._expect == _EXPECT_VALUE:
                self._start_value(i, _IN_STRING_VALUE)
        elif ch in "{[":
            return self._open(i, ch)
        elif ch in "}]":
            return self._close(i)
        elif self._at_element():
            self._element_char(i, ch)
        return True

    def _at_element(self) -> bool:
        return self._depth == 2 and self._cur is not None

    def _string_char(self, i: int, ch: str) -> None:
        if self._escaped:
            self._escaped = False
        elif ch == "\\":
            self._escaped = True
        elif ch == '"':
            self._in_string = False
            if not self._at_element():
                return
            if self._expect == _EXPECT_KEY:
                self._key = self.text[self._string_start + 1 : i]
                self._expect = _EXPECT_COLON
            elif self._expect == _IN_STRING_VALUE:
                self._end_value(i + 1)

    def _open(self, i: int, ch: str) -> bool:
        if self._depth == 0:
            if ch != "[":
                return False
        elif self._depth == 1:
            if ch != "{":
                return False
            self._cur = _CallSpan()
            self.spans.append(self._cur)
            self._expect = _EXPECT_KEY
            self._key = None
        elif self._at_element() and self._expect == _EXPECT_VALUE:
            self._start_value(i, _IN_CONTAINER_VALUE)
        self._depth += 1
        return True

    def _close(self, i: int) -> bool:
        # Brackets are not matched by kind (nor are they in vLLM): any closer pops a level.
        if self._at_element() and self._expect == _IN_SCALAR_VALUE:
            self._end_value(i)
        self._depth -= 1
        if self._at_element() and self._expect == _IN_CONTAINER_VALUE:
            self._end_value(i + 1)
        elif self._depth == 1:
            self._cur = None
        elif self._depth <= 0:
            return False
        return True

    def _element_char(self, i: int, ch: str) -> None:
        """A character outside strings and brackets, directly inside an element object."""
        if ch == ":":
            if self._expect == _EXPECT_COLON:
                self._expect = _EXPECT_VALUE
        elif ch == ",":
            if self._expect == _IN_SCALAR_VALUE:
                self._end_value(i)
            self._expect = _EXPECT_KEY
            self._key = None
        elif ch.isspace():
            if self._expect == _IN_SCALAR_VALUE:
                self._end_value(i)
        elif self._expect == _EXPECT_VALUE:
            self._start_value(i, _IN_SCALAR_VALUE)

    def _start_value(self, pos: int, state: int) -> None:
        assert self._cur is not None
        self._value_start = pos
        if self._key == "parameters":
            self._cur.args_start = pos
        self._expect = state

    def _end_value(self, pos: int) -> None:
        cur = self._cur
        assert cur is not None
        if self._key == "parameters":
            cur.args_end = pos
        elif self._key == "name" and self._expect == _IN_STRING_VALUE:
            try:
                cur.name = json.loads(self.text[self._value_start : pos])
                cur.name_end = pos
            except json.JSONDecodeError:
                # Never ready, as the non-streamed path rejects the array.
                cur.name = None
        self._expect = _AFTER_VALUE


class RequiredCallsParser(ToolParser):
    """The output of a ``tool_choice="required"`` request: a JSON array of calls."""

    name = "required"

    def __init__(self) -> None:
        self._scanner = _ArrayScanner()

    def extract(self, text: str) -> ToolCallResult:
        try:
            definitions = _CALL_LIST.validate_json(text)
        except ValidationError:
            definitions = []
        calls = [
            ToolCall(name=d.name, arguments=json.dumps(d.parameters, ensure_ascii=False))
            for d in definitions
        ]
        return ToolCallResult(bool(calls), calls, None)

    def feed(self, delta_text: str) -> DeltaMessage | None:
        sent_len = len(self._scanner.text)
        self._scanner.feed(delta_text)
        text = self._scanner.text
        pieces: list[DeltaToolCall] = []
        for index, span in enumerate(self._scanner.spans):
            if not span.ready:
                break  # elements come in order: nothing later can be ready
            assert span.args_start is not None
            end = span.args_end if span.args_end is not None else len(text)
            if span.ready_at(sent_len):
                # Announced by an earlier delta: only the new parameters text.
                new_args = text[min(end, sent_len) : end]
                if new_args:
                    pieces.append(DeltaToolCall(index=index, arguments=new_args))
                continue
            pieces.append(
                DeltaToolCall(
                    index=index,
                    id=make_tool_call_id(),
                    type="function",
                    name=span.name,
                    arguments=text[span.args_start : end],
                )
            )
        return DeltaMessage(tool_calls=pieces) if pieces else None
