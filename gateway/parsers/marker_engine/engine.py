"""Events into deltas and whole results (vLLM's ``ParserEngine``), for one sequence."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from gateway.parsers.base import DeltaMessage, DeltaToolCall, ToolCall, make_tool_call_id
from gateway.parsers.marker_engine.call_pieces import (
    NAME_RE,
    Slot,
    coalesce_pieces,
    safe_arg_prefix,
    split_name_and_args,
)
from gateway.parsers.marker_engine.grammar import Ev, Event, Grammar, State
from gateway.parsers.marker_engine.machine import Machine
from gateway.parsers.marker_engine.schema_coercion import (
    coerce_dict,
    find_tool_name,
    find_tool_properties,
    streamable_string_keys,
)


class Engine:
    """vLLM's ``ParserEngine`` for one sequence: events to deltas and to whole results.

    Family modules subclass it for their hooks (``preprocess``, ``emit_name``, ...)."""

    # Whether the argument chunk that sends a call's name is also sent as arguments (vLLM's
    # parent engine drops it; parsers whose name ends at the arguments' first character,
    # Mistral's ``name{...}``, override ``_handle_arg_chunk`` to send it).
    args_with_name: bool = False

    def __init__(
        self,
        grammar: Grammar,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        special_tokens: Collection[str] = (),
    ) -> None:
        self.grammar = grammar
        self.tools = list(tools) if tools else None
        self.machine = Machine(grammar, special_tokens)
        self.streaming_initialized = False
        # vLLM's ``_suppress_tool_calls`` (tool_choice "none"): tool events are ignored, so the
        # call markup is dropped while the text around it stays content as written. Kept
        # across resets, as vLLM's flag is.
        self.suppress_calls = False
        self.reset()

    def reset(self, initial_state: State | None = None) -> None:
        self.machine.reset(initial_state)
        self.reasoning_ended = not self.grammar.has_reasoning
        self.slots: list[Slot] = []
        self.deferred_content = ""
        self.deferred_reasoning = ""
        self.content_has_nonws = False

    def initialize_streaming(self, initial_state: State | None = None) -> None:
        if not self.streaming_initialized:
            self.streaming_initialized = True
            self.reset(initial_state)

    def preprocess(self, text: str) -> str:
        """Hook: rewrite a fed text before the machine sees it."""
        return text

    def feed(self, text: str, *, streaming: bool) -> list[Event]:
        return self.machine.feed(self.preprocess(text), streaming=streaming)

    # Streaming.

    def stream(self, delta: str) -> DeltaMessage | None:
        return self.strip_trailing_reasoning(self.to_delta(self.feed(delta, streaming=True)))

    def finish_streaming(self) -> DeltaMessage | None:
        events = self.machine.finish()
        if events or self.deferred_content:
            return self.to_delta(events, finished=True)
        return None

    def to_delta(self, events: list[Event], finished: bool = False) -> DeltaMessage | None:
        """vLLM's ``_events_to_delta``: content, reasoning and tool call pieces of some events."""
        if not events and not self.deferred_content:
            return None
        calls: list[DeltaToolCall] = []
        content_parts: list[str] = []
        reasoning_parts: list[str] = []
        carried = self.deferred_content
        seen_tool_event = False
        for event in events:
            if event.type == Ev.TEXT:
                # Text after a tool event in the same delta waits for a delta without calls.
                if seen_tool_event:
                    self.deferred_content += event.value
                else:
                    content_parts.append(event.value)
            elif event.type == Ev.REASONING:
                reasoning_parts.append(event.value)
            elif event.type == Ev.REASONING_END:
                self.reasoning_ended = True
            elif event.type in (Ev.TOOL_START, Ev.TOOL_NAME, Ev.ARGS, Ev.TOOL_END):
                if self.suppress_calls:
                    continue  # no slot, no deferral: neighbouring text is never trimmed
                seen_tool_event = True
                self._on_tool_event(event, calls)
        if len(calls) > 1:
            calls = coalesce_pieces(calls)
        if self.deferred_content and (not seen_tool_event or not calls):
            deferred_now = self.deferred_content[len(carried) :]
            if carried:
                content_parts.insert(0, carried)
            if deferred_now:
                content_parts.append(deferred_now)
            self.deferred_content = ""
        content = self._filter_whitespace_content("".join(content_parts), finished)
        reasoning = "".join(reasoning_parts) or None
        if content or calls or reasoning:
            return DeltaMessage(reasoning=reasoning, content=content or None, tool_calls=calls)
        return None

    def _filter_whitespace_content(self, content: str, finished: bool) -> str:
        """Whitespace-only content waits until it is known whether tool calls follow."""
        if self.content_has_nonws or not content:
            return content
        if content.strip():
            self.content_has_nonws = True
            return content
        if self.slots:
            return "" if self.grammar.drop_whitespace_only_content_before_tools else content
        if not finished:
            self.deferred_content = content
            return ""
        return content

    def _on_tool_event(self, event: Event, calls: list[DeltaToolCall]) -> None:
        if event.type == Ev.TOOL_START:
            while len(self.slots) <= event.index:
                self.slots.append(Slot())
        elif event.type == Ev.TOOL_NAME:
            self.slots[event.index].name += event.value
        elif event.type == Ev.ARGS:
            self.handle_args(event, calls)
        else:
            self.handle_tool_end(event, calls)

    def strip_trailing_reasoning(self, delta: DeltaMessage | None) -> DeltaMessage | None:
        """Trailing reasoning whitespace waits until more reasoning shows it is not trailing."""
        if not self.grammar.strip_trailing_reasoning_whitespace:
            return delta
        if delta is not None and delta.reasoning is not None:
            combined = self.deferred_reasoning + delta.reasoning
            trimmed = combined.rstrip()
            self.deferred_reasoning = combined[len(trimmed) :]
            delta.reasoning = trimmed or None
            if delta.reasoning is None and delta.content is None and not delta.tool_calls:
                return None
        elif self.deferred_reasoning and self.reasoning_ended:
            self.deferred_reasoning = ""
        return delta

    # Tool call pieces.

    def accept_name(self, name: str) -> bool:
        """A call needs a name; a validating grammar also wants one of the request's tools."""
        if not name:
            return False
        if self.grammar.validate_tool_names and self.tools:
            return find_tool_name(self.tools, name)
        return True

    def ensure_id(self, slot: Slot) -> None:
        if not slot.id:
            slot.id = make_tool_call_id()

    def _name_piece(self, index: int, name: str, arguments: str | None = None) -> DeltaToolCall:
        slot = self.slots[index]
        slot.name = name
        slot.name_sent = True
        slot.string_keys = streamable_string_keys(find_tool_properties(self.tools, name))
        self.ensure_id(slot)
        return DeltaToolCall(index, slot.id, "function", name, arguments)

    def emit_name(self, index: int, calls: list[DeltaToolCall], name: str | None) -> None:
        if name is not None and self.accept_name(name):
            calls.append(self._name_piece(index, name))

    def handle_args(self, event: Event, calls: list[DeltaToolCall]) -> None:
        slot = self.slots[event.index]
        if event.value:
            slot.args += event.value
        if not slot.name_sent:
            if slot.name:
                self.emit_name(event.index, calls, slot.name)
            elif event.value:
                self.emit_name(event.index, calls, self.name_from_args(event.index))
            if self.args_with_name and event.value and slot.name_sent:
                calls.append(DeltaToolCall(event.index, arguments=event.value))
        elif event.value and (diff := self._arg_delta(event.index, event.value)):
            calls.append(DeltaToolCall(event.index, arguments=diff))

    def handle_tool_end(self, event: Event, calls: list[DeltaToolCall]) -> None:
        index = event.index
        if index >= len(self.slots):
            return
        remaining = self._flush_converter(index)
        slot = self.slots[index]
        if not slot.name_sent:
            name = slot.name or self.name_from_args(index) or ""
            if self.accept_name(name):
                calls.append(self._name_piece(index, name, remaining or ""))
                remaining = None
        if remaining and slot.name_sent:
            calls.append(DeltaToolCall(index, arguments=remaining))

    def name_from_args(self, index: int) -> str | None:
        """Hook: a call's name found in its argument text (vLLM's ``_try_extract_name``)."""
        match = NAME_RE.search(self.slots[index].args)
        return (match.group(1) or None) if match else None

    def fix_arg_types(self, args_json: str, name: str) -> str:
        """Arguments coerced to the types of the tool's schema (unchanged text if none change)."""
        if not self.tools or not name:
            return args_json
        try:
            args = json.loads(args_json)
        except ValueError:
            return args_json
        properties = find_tool_properties(self.tools, name)
        if not isinstance(args, dict) or not properties:
            return args_json
        if coerce_dict(args, properties):
            return json.dumps(args, ensure_ascii=False)
        return args_json

    def _arg_delta(self, index: int, raw_delta: str) -> str | None:
        converter = self.grammar.arg_converter
        if converter is None:
            return raw_delta
        structural = self.grammar.arg_structural_chars
        if not self.grammar.stream_arg_deltas or (
            structural is not None and structural.isdisjoint(raw_delta)
        ):
            return None
        slot = self.slots[index]
        try:
            current = converter(slot.args, True)
        except (ValueError, TypeError):
            return None
        if not current:
            return None
        if slot.name:
            current = self.fix_arg_types(current, slot.name)
        safe = safe_arg_prefix(current, slot.string_keys)
        prev = slot.streamed_json
        if not safe or safe == prev or (prev and not safe.startswith(prev)):
            return None
        slot.streamed_json = safe
        return safe[len(prev) :] or None

    def _flush_converter(self, index: int) -> str | None:
        converter = self.grammar.arg_converter
        if converter is None:
            return None
        slot = self.slots[index]
        try:
            final = converter(slot.args, False)
        except (ValueError, TypeError):
            return None
        if final:
            final = self.fix_arg_types(final, slot.name)
        prev = slot.streamed_json
        if final and len(final) > len(prev):
            if prev and not final.startswith(prev):
                return None
            slot.streamed_json = final
            return final[len(prev) :]
        return None

    # Whole outputs.

    def extract_args_json(self, raw_args: str, name: str) -> str:
        if not raw_args.strip():
            return "{}"
        return self.name_and_args(raw_args)[1]

    def name_and_args(self, raw_body: str) -> tuple[Any, str]:
        """Hook: (name, arguments JSON) of a body holding both (``_extract_name_and_args``)."""
        return split_name_and_args(raw_body)

    def tool_calls(self) -> list[ToolCall]:
        """The calls in the slots (vLLM's ``_build_extracted_result``)."""
        calls: list[ToolCall] = []
        for slot in self.slots:
            if not slot.name and not slot.args:
                continue
            name, raw = slot.name.strip(), slot.args
            if not name and raw.strip():
                name, args_json = self.name_and_args(raw)
            elif raw.strip():
                args_json = self._converted_args(raw, name)
            else:
                args_json = "{}"
            if isinstance(name, str) and self.accept_name(name):
                self.ensure_id(slot)
                args_json = self.fix_arg_types(args_json, name)
                calls.append(ToolCall(name=name, arguments=args_json, id=slot.id))
        return calls

    def _converted_args(self, raw: str, name: str) -> str:
        converter = self.grammar.arg_converter
        if converter is not None:
            try:
                return converter(raw, False)
            except (ValueError, TypeError):
                pass
        return self.extract_args_json(raw, name)

    def strip_content(self, content: str, tools_called: bool) -> str | None:
        if tools_called:
            if self.grammar.strip_content_whitespace_with_tools:
                content = content.strip()
            elif self.grammar.drop_whitespace_only_content_before_tools and not content.strip():
                content = ""
        return content or None

    def single_pass(
        self, text: str, initial_state: State | None = None
    ) -> tuple[str | None, str | None, list[ToolCall]]:
        """(reasoning, content, calls) of a whole output (vLLM's ``_single_pass_parse``)."""
        self.reset(initial_state)
        events = self.feed(text, streaming=False) + self.machine.finish()
        delta = self.to_delta(events, finished=True)
        calls = self.tool_calls()
        reasoning = delta.reasoning if delta else None
        if reasoning and self.grammar.strip_trailing_reasoning_whitespace:
            reasoning = reasoning.rstrip() or None
        content = delta.content if delta else None
        if content:
            content = self.strip_content(content, bool(calls))
        return reasoning, content, calls

    def extract_reasoning(self, text: str) -> tuple[str | None, str | None]:
        """vLLM's ``ParserEngine.extract_reasoning`` (events, no tool call bookkeeping)."""
        self.reset()
        reasoning: list[str] = []
        content: list[str] = []
        for event in self.feed(text, streaming=False) + self.machine.finish():
            if event.type == Ev.REASONING:
                reasoning.append(event.value)
            elif event.type == Ev.TEXT:
                content.append(event.value)
            elif event.type == Ev.REASONING_END:
                self.reasoning_ended = True
        raw = "".join(reasoning)
        if self.grammar.strip_trailing_reasoning_whitespace:
            raw = raw.rstrip()
        return raw or None, "".join(content) or None
