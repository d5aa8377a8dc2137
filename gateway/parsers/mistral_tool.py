"""``--tool-call-parser mistral``: vLLM 0.32's ``MistralToolParser``
(``vllm/tool_parsers/mistral_tool_parser.py``, an adapter over ``MistralParser`` in
``vllm/parser/mistral.py`` and its parser engine in ``vllm/parser/engine/``).

With a Hugging Face tokenizer vLLM picks the format from the vocabulary:

- ``[ARGS]`` in it (tokenizer v11+, e.g. Mistral Small 3.2, Magistral, Devstral 2507): calls are
  ``[TOOL_CALLS]name[ARGS]{...}`` (or ``[TOOL_CALLS]name{...}``), one marker per call, read by
  the declarative engine: ``MistralToolParser``, ported here as ``MistralEngine``.
- no ``[ARGS]`` (pre-v11, e.g. Mistral 7B v0.3, Nemo, Small 3.1): calls are a JSON list after
  one marker, ``[TOOL_CALLS][{"name": ..., "arguments": {...}}]``, streamed through ``ijson``
  events: ``MistralPreV11ToolParser``.

``mistral_tool_parser(vocab)`` chooses as vLLM does; the registry's ``mistral`` is the v11+
parser. Tool call ids are Mistral's: 9 random alphanumerics.

v11+ behaviour (auto tool choice): text before the first marker is content (stripped, ``None``
if blank, when there are calls); the name runs to ``[ARGS]`` or ``{``; the arguments are the
first JSON value after it, or the raw text when it does not parse, ``{}`` when empty, and are
coerced to the request's tool schema (``tools=``) as vLLM's ``_fix_arg_types`` does. Streaming
sends the raw argument text as it arrives (no coercion, trailing text included), holding back
an outermost closing brace until more text or the end; a call cut off before its arguments
gets ``""`` streamed but ``{}`` whole; whitespace-only content is held back and dropped when a
call follows. vLLM also drops its tokenizer's other special tokens (``</s>``...) from the text;
a text-only parser cannot know them and keeps them.

Pre-v11 behaviour: see ``MistralPreV11ToolParser``.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Container, Generator
from dataclasses import dataclass
from enum import Enum, auto
from string import ascii_letters, digits
from typing import Any

import ijson

from gateway.parsers.base import (
    DeltaMessage,
    DeltaToolCall,
    ParserContext,
    ToolCall,
    ToolCallResult,
    ToolParser,
)

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
THINK_START = "[THINK]"
THINK_END = "[/THINK]"
OPEN_BRACE = "{"
_ALPHANUMERIC = ascii_letters + digits


def make_mistral_tool_call_id() -> str:
    """Mistral's tool call id format (mistral-common validates it): 9 alphanumerics."""
    return "".join(random.choices(_ALPHANUMERIC, k=9))


# ── Engine: lexer ───────────────────────────────────────────────────────────────────────────


class _Lexer:
    """vLLM's ``IncrementalLexer`` for literal terminals: splits text into terminals and
    content, holding back a tail that may still grow into a terminal."""

    def __init__(self, literals: tuple[str, ...]) -> None:
        self._literals = literals
        self._first_chars = frozenset(lit[0] for lit in literals)
        self._prefixes = frozenset(lit[:i] for lit in literals for i in range(1, len(lit)))
        self.buffer = ""

    def feed(self, text: str) -> list[tuple[str | None, str]]:
        """(terminal, text) pairs, terminal ``None`` for content."""
        if not self.buffer and self._first_chars.isdisjoint(text):
            return [(None, text)]
        self.buffer += text
        return self._drain(final=False)

    def flush(self) -> list[tuple[str | None, str]]:
        tokens = self._drain(final=True) if self.buffer else []
        if self.buffer:
            tokens.append((None, self.buffer))
            self.buffer = ""
        return tokens

    def _drain(self, *, final: bool) -> list[tuple[str | None, str]]:
        tokens: list[tuple[str | None, str]] = []
        while self.buffer:
            if self._first_chars.isdisjoint(self.buffer):
                tokens.append((None, self.buffer))
                self.buffer = ""
                break
            # No literal here is a prefix of another, so a held prefix is never also a match.
            if self.buffer in self._prefixes and not final:
                break
            match = next((lit for lit in self._literals if self.buffer.startswith(lit)), None)
            end = len(match) if match else max(self._content_boundary(), 1)
            tokens.append((match, self.buffer[:end]))
            self.buffer = self.buffer[end:]
        return tokens

    def _content_boundary(self) -> int:
        """Where a terminal (or the start of one, at the end) may begin after position 0."""
        buf = self.buffer
        for i in range(1, len(buf)):
            if buf[i] in self._first_chars and any(
                buf[i : i + len(lit)] == lit[: len(buf) - i] for lit in self._literals
            ):
                return i
        return len(buf)


# ── Engine: state machine ───────────────────────────────────────────────────────────────────


class State(Enum):
    CONTENT = auto()
    REASONING = auto()
    TOOL_NAME = auto()
    TOOL_ARGS = auto()


class Ev(Enum):
    TEXT = auto()
    REASONING = auto()
    REASONING_END = auto()
    CALL_START = auto()
    NAME = auto()
    ARGS = auto()
    CALL_END = auto()


@dataclass
class Event:
    type: Ev
    value: str
    index: int


_TOOL_TERMINALS = frozenset({TOOL_CALLS, ARGS, OPEN_BRACE})


def _transitions(think: bool) -> dict[tuple[State, str], tuple[State, tuple[Ev, ...]]]:
    """``mistral_config``: ``think`` is vLLM's ``special_token`` reasoning encoding ([THINK] in
    the vocabulary), otherwise ``none``."""
    c, r, name, args = State.CONTENT, State.REASONING, State.TOOL_NAME, State.TOOL_ARGS
    table = {
        (name, ARGS): (args, ()),
        # The "{" that ends a name is the first character of the arguments.
        (name, OPEN_BRACE): (args, (Ev.ARGS,)),
        (args, TOOL_CALLS): (name, (Ev.CALL_END, Ev.CALL_START)),
    }
    if not think:
        table[(c, TOOL_CALLS)] = (name, (Ev.CALL_START,))
        return table
    return table | {
        (c, THINK_START): (r, ()),
        (r, THINK_START): (r, ()),
        (r, THINK_END): (c, (Ev.REASONING_END,)),
        (c, THINK_END): (c, ()),
        # A tool call ends reasoning implicitly.
        (r, TOOL_CALLS): (name, (Ev.REASONING_END, Ev.CALL_START)),
        (c, TOOL_CALLS): (name, (Ev.REASONING_END, Ev.CALL_START)),
    }


class _Grammar:
    """vLLM's ``StreamingParserEngine`` for ``mistral_config``: text to events."""

    def __init__(self, *, think: bool, skip_tools: bool) -> None:
        literals = (TOOL_CALLS, ARGS, OPEN_BRACE) + ((THINK_START, THINK_END) if think else ())
        self._lexer = _Lexer(literals)
        self._table = _transitions(think)
        self._skip_tools = skip_tools
        self.reset()

    def reset(self) -> None:
        self.state = State.CONTENT
        self.index = -1
        self._lexer.buffer = ""
        self._args = ""  # argument text not yet emitted
        self._args_depth = 0
        self._in_string = False
        self._escape = False

    def feed(self, text: str) -> list[Event]:
        events: list[Event] = []
        for terminal, value in self._lexer.feed(text):
            events += self._token(terminal, value)
        return events

    def finish(self) -> list[Event]:
        events: list[Event] = []
        for terminal, value in self._lexer.flush():
            events += self._token(terminal, value)
        if self._args:
            events.append(Event(Ev.ARGS, self._args, self.index))
            self._args = ""
        if self.state in (State.TOOL_NAME, State.TOOL_ARGS):
            if self.index >= 0:
                events.append(Event(Ev.CALL_END, "", self.index))
        elif self.state == State.REASONING:
            events.append(Event(Ev.REASONING_END, "", self.index))
        self.state = State.CONTENT
        return events

    def _token(self, terminal: str | None, value: str) -> list[Event]:
        if terminal is None:
            return self._emit(value) if value else []
        transition = self._table.get((self.state, terminal))
        if transition is None:
            return self._emit(value)
        next_state, events = transition
        if self._skip_tools and terminal in _TOOL_TERMINALS:
            # The reasoning pass: a tool call ends reasoning and stays content for the tool
            # pass. (Mistral's other tool transitions start inside a call, never reached here.)
            if Ev.REASONING_END in events:
                self.state = State.CONTENT
                return [Event(Ev.REASONING_END, value, self.index), Event(Ev.TEXT, value, -1)]
            return self._emit(value)
        return self._apply(next_state, events, value)

    def _apply(self, next_state: State, types: tuple[Ev, ...], value: str) -> list[Event]:
        events: list[Event] = []
        if self.state == State.TOOL_ARGS and next_state != State.TOOL_ARGS and self._args:
            events.append(Event(Ev.ARGS, self._args, self.index))
            self._args = ""
        self.state = next_state
        for kind in types:
            if kind == Ev.CALL_START:
                self.index += 1
            events.append(Event(kind, value, self.index))
        if next_state == State.TOOL_ARGS:
            self._args_depth, self._in_string, self._escape = 0, False, False
        return events

    def _emit(self, text: str) -> list[Event]:
        if self.state == State.TOOL_ARGS:
            return [e for ch in text for e in self._args_char(ch)]
        kind = {State.CONTENT: Ev.TEXT, State.REASONING: Ev.REASONING, State.TOOL_NAME: Ev.NAME}
        return [Event(kind[self.state], text, self.index)]

    def _args_char(self, ch: str) -> list[Event]:
        """Argument text goes out as it comes, except a closing brace or bracket that brings
        the depth back to 0: held until the next character (or the end) confirms it."""
        self._args += ch
        if self._escape:
            self._escape = False
        elif self._in_string:
            if ch == "\\":
                self._escape = True
            elif ch == '"':
                self._in_string = False
        elif ch == '"':
            self._in_string = True
        elif ch in "{[":
            self._args_depth += 1
        elif ch in "}]":
            self._args_depth = max(self._args_depth - 1, 0)
            if self._args_depth == 0:
                return []
        out, self._args = self._args, ""
        return [Event(Ev.ARGS, out, self.index)]


# ── Engine: events to deltas (vLLM's ParserEngine with MistralParser's overrides) ───────────


@dataclass
class _Slot:
    id: str = ""
    name: str = ""
    args: str = ""
    name_sent: bool = False


class MistralEngine:
    """One sequence's Mistral parse, as vLLM's ``MistralParser`` (v11+) runs it for the tool
    adapter (``skip_tools=False``) or the reasoning adapter (``skip_tools=True``).

    ``think``: [THINK]/[/THINK] are markers (vLLM: ``[THINK]`` in the vocabulary and, for the
    tool parser, a reasoning parser configured; without one vLLM's tool parser reads them as
    plain text, which is what ``think=False`` does).
    """

    def __init__(
        self,
        *,
        think: bool,
        skip_tools: bool = False,
        tools: list[dict[str, Any]] | None = None,
    ) -> None:
        self._grammar = _Grammar(think=think, skip_tools=skip_tools)
        self._has_reasoning = think
        self._tools = tools
        self._reset()

    def _reset(self) -> None:
        self._grammar.reset()
        self.reasoning_ended = not self._has_reasoning
        self._slots: list[_Slot] = []
        self._deferred_content = ""
        self._deferred_reasoning = ""
        self._content_has_nonws = False

    # Streaming: vLLM's extract_*_streaming then finish_streaming.

    def stream(self, delta_text: str) -> DeltaMessage | None:
        return self._strip_trailing_reasoning(self._to_delta(self._grammar.feed(delta_text)))

    def finish_stream(self) -> DeltaMessage | None:
        events = self._grammar.finish()
        if events or self._deferred_content:
            return self._to_delta(events, finished=True)
        return None

    # Whole outputs.

    def split_reasoning(self, text: str) -> tuple[str | None, str | None]:
        """vLLM's ``extract_reasoning``: (reasoning, content)."""
        self._reset()
        events = self._grammar.feed(text) + self._grammar.finish()
        reasoning = "".join(e.value for e in events if e.type == Ev.REASONING).rstrip()
        content = "".join(e.value for e in events if e.type == Ev.TEXT)
        return reasoning or None, content or None

    def extract_calls(self, text: str) -> ToolCallResult:
        """vLLM's ``extract_tool_calls_from_content``, as ``DelegatingParser`` returns it."""
        self._reset()
        delta = self._to_delta(self._grammar.feed(text) + self._grammar.finish(), finished=True)
        calls = self._calls()
        content = delta.content if delta else None
        if content and calls:
            content = content.strip()
        return ToolCallResult(bool(calls), calls, content or None)

    def _calls(self) -> list[ToolCall]:
        calls: list[ToolCall] = []
        for slot in self._slots:
            if not slot.name and not slot.args:
                continue
            name = slot.name.strip()
            args = _first_json_value(slot.args) if slot.args.strip() else "{}"
            if not slot.id:
                slot.id = make_mistral_tool_call_id()
            args = _fix_arg_types(args, name, self._tools)
            calls.append(ToolCall(name=name, arguments=args, id=slot.id))
        return calls

    # vLLM's _events_to_delta.

    def _to_delta(self, events: list[Event], finished: bool = False) -> DeltaMessage | None:
        if not events and not self._deferred_content:
            return None
        pieces: list[DeltaToolCall] = []
        content_parts: list[str] = []
        reasoning_parts: list[str] = []
        carried = self._deferred_content
        seen_tool_event = False
        for event in events:
            if event.type == Ev.TEXT:
                # Text after a call piece in the same batch waits for a later delta.
                if seen_tool_event:
                    self._deferred_content += event.value
                else:
                    content_parts.append(event.value)
            elif event.type == Ev.REASONING:
                reasoning_parts.append(event.value)
            elif event.type == Ev.REASONING_END:
                self.reasoning_ended = True
            else:
                seen_tool_event = True
                self._tool_event(event, pieces)
        pieces = _coalesce(pieces)
        if self._deferred_content and (not seen_tool_event or not pieces):
            now = self._deferred_content[len(carried) :]
            content_parts = ([carried] if carried else []) + content_parts + ([now] if now else [])
            self._deferred_content = ""
        content = self._whitespace_rule("".join(content_parts), finished)
        reasoning = "".join(reasoning_parts)
        if content or pieces or reasoning:
            return DeltaMessage(
                reasoning=reasoning or None, content=content or None, tool_calls=pieces
            )
        return None

    def _whitespace_rule(self, content: str, finished: bool) -> str:
        """Whitespace-only content before any text is held back, and dropped once a call
        exists (the newline before [TOOL_CALLS], say)."""
        if self._content_has_nonws or not content:
            return content
        if content.strip():
            self._content_has_nonws = True
            return content
        if self._slots:
            return ""
        if not finished:
            self._deferred_content = content
            return ""
        return content

    def _tool_event(self, event: Event, pieces: list[DeltaToolCall]) -> None:
        if event.type == Ev.CALL_START:
            while len(self._slots) <= event.index:
                self._slots.append(_Slot())
        elif event.type == Ev.NAME:
            self._slots[event.index].name += event.value
        elif event.type == Ev.ARGS:
            self._args_event(event, pieces)
        elif event.type == Ev.CALL_END and event.index < len(self._slots):
            slot = self._slots[event.index]
            if not slot.name_sent:
                # A call cut off before its arguments: name (maybe "") and "" arguments.
                self._name_piece(event.index, pieces, arguments="")

    def _args_event(self, event: Event, pieces: list[DeltaToolCall]) -> None:
        slot = self._slots[event.index]
        slot.args += event.value
        if slot.name_sent:
            if event.value:
                pieces.append(DeltaToolCall(event.index, arguments=event.value))
        elif slot.name or event.value:
            # Mistral accepts any name once the arguments started, "" included.
            self._name_piece(event.index, pieces)
            if event.value:
                pieces.append(DeltaToolCall(event.index, arguments=event.value))

    def _name_piece(self, index: int, pieces: list[DeltaToolCall], **extra: str) -> None:
        slot = self._slots[index]
        slot.name_sent = True
        if not slot.id:
            slot.id = make_mistral_tool_call_id()
        pieces.append(DeltaToolCall(index, id=slot.id, type="function", name=slot.name, **extra))

    def _strip_trailing_reasoning(self, delta: DeltaMessage | None) -> DeltaMessage | None:
        """Trailing whitespace of the reasoning waits until more reasoning follows (so the
        streamed reasoning ends stripped, as the whole one)."""
        if delta is not None and delta.reasoning is not None:
            combined = self._deferred_reasoning + delta.reasoning
            trimmed = combined.rstrip()
            self._deferred_reasoning = combined[len(trimmed) :]
            delta.reasoning = trimmed or None
            if delta.reasoning is None and delta.content is None and not delta.tool_calls:
                return None
        elif self._deferred_reasoning and self.reasoning_ended:
            self._deferred_reasoning = ""
        return delta


def _coalesce(pieces: list[DeltaToolCall]) -> list[DeltaToolCall]:
    """One piece per call index, in first-seen order (vLLM's ``_coalesce_tool_call_deltas``)."""
    merged: dict[int, DeltaToolCall] = {}
    for piece in pieces:
        into = merged.setdefault(piece.index, piece)
        if into is piece:
            continue
        into.id = into.id or piece.id
        into.type = into.type or piece.type
        if into.name is None:
            into.name = piece.name
        if piece.arguments is not None:
            into.arguments = (into.arguments or "") + piece.arguments
    return list(merged.values())


def _first_json_value(raw: str) -> str:
    """The first JSON value of the argument text (trailing text dropped), else the raw text."""
    stripped = raw.strip()
    if not stripped:
        return "{}"
    try:
        _, end = json.JSONDecoder().raw_decode(stripped)
    except json.JSONDecodeError:
        return stripped
    return stripped[:end]


# ── Schema coercion: vLLM's ParserEngine._fix_arg_types and tool_parsers/utils helpers ──────

_TYPE_ALIASES = {
    **dict.fromkeys(("str", "text", "varchar", "char", "enum"), "string"),
    **dict.fromkeys(
        ("int", "int32", "int64", "uint", "uint32", "uint64", "long", "short", "unsigned"),
        "integer",
    ),
    **dict.fromkeys(("float", "float32", "float64", "double"), "number"),
    "bool": "boolean",
    "dict": "object",
    **dict.fromkeys(("arr", "list", "sequence"), "array"),
}
_TYPE_PRIORITY = ("null", "integer", "number", "boolean", "object", "array", "string")
_ENUM_TYPES = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"))


def _tool_properties(tools: list[dict[str, Any]] | None, name: str) -> dict[str, Any]:
    """``properties`` of the named tool's parameters (OpenAI chat or Responses tool shape)."""
    for tool in tools or []:
        function = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(function, dict) and function.get("name") == name:
            properties = (function.get("parameters") or {}).get("properties", {})
            return properties if isinstance(properties, dict) else {}
    return {}


def _schema_types(schema: Any) -> list[str]:
    if not isinstance(schema, dict):
        return ["string"]
    types: set[str] = set()
    declared = schema.get("type")
    if isinstance(declared, str):
        types.add(declared)
    elif isinstance(declared, list):
        types.update(t for t in declared if isinstance(t, str))
    enum = schema.get("enum")
    if isinstance(enum, list):
        for value in enum:
            if value is None:
                types.add("null")
            elif isinstance(value, list):
                types.add("array")
            elif isinstance(value, dict):
                types.add("object")
            else:
                types.update(next((t for c, t in _ENUM_TYPES if isinstance(value, c)), ()))
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list):
            for choice in schema[key]:
                types.update(_schema_types(choice))
    return list(types) if types else ["string"]


def _is_json_finite(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (ValueError, TypeError):
        return False
    return True


def _coerce_string(value: str, types: list[str]) -> Any:
    """vLLM's ``coerce_to_schema_type``: the first type (by priority) the string reads as."""
    wanted = {_TYPE_ALIASES.get(key, key) for key in (t.strip().lower() for t in types)}
    for kind in _TYPE_PRIORITY:
        if kind not in wanted:
            continue
        if kind == "null" and value.lower() == "null":
            return None
        if kind == "string":
            return value
        if kind == "integer":
            try:
                return int(value)
            except (ValueError, TypeError):
                continue
        if kind == "number":
            try:
                number = float(value)
            except (ValueError, TypeError):
                continue
            if math.isfinite(number):
                return number if number != int(number) else int(number)
        if kind == "boolean":
            if value.lower().strip() in ("true", "1"):
                return True
            if value.lower().strip() in ("false", "0"):
                return False
        if kind in ("object", "array"):
            try:
                parsed = json.loads(value)
            except ValueError:
                continue
            if _is_json_finite(parsed):
                return parsed
    try:
        parsed = json.loads(value)
    except ValueError:
        return value
    return parsed if _is_json_finite(parsed) else value


def _coerce_value(value: Any, schema: dict[str, Any]) -> tuple[Any, bool]:
    if isinstance(value, str):
        coerced = _coerce_string(value, _schema_types(schema))
        return coerced, coerced is not value
    if isinstance(value, dict):
        properties = schema.get("properties")
        if isinstance(properties, dict):
            return value, _coerce_dict(value, properties)
        return value, False
    if isinstance(value, list):
        items = schema.get("items")
        changed = False
        if isinstance(items, dict):
            for i, item in enumerate(value):
                coerced, item_changed = _coerce_value(item, items)
                if item_changed:
                    value[i], changed = coerced, True
        return value, changed
    coerced = _coerce_string(json.dumps(value, ensure_ascii=False), _schema_types(schema))
    if type(coerced) is not type(value) or coerced != value:
        return coerced, True
    return value, False


def _coerce_dict(args: dict[str, Any], properties: dict[str, Any]) -> bool:
    changed = False
    for key, value in args.items():
        schema = properties.get(key)
        if isinstance(schema, dict):
            coerced, value_changed = _coerce_value(value, schema)
            if value_changed:
                args[key], changed = coerced, True
    return changed


def _fix_arg_types(args_json: str, name: str, tools: list[dict[str, Any]] | None) -> str:
    """Arguments re-typed to the tool's schema (re-serialised only when something changed)."""
    if not tools or not name:
        return args_json
    try:
        args = json.loads(args_json)
    except ValueError:
        return args_json
    properties = _tool_properties(tools, name)
    if not isinstance(args, dict) or not properties:
        return args_json
    return json.dumps(args, ensure_ascii=False) if _coerce_dict(args, properties) else args_json


# ── The parsers ─────────────────────────────────────────────────────────────────────────────


class MistralToolParser(ToolParser):
    """v11+ ``[TOOL_CALLS]name[ARGS]{...}`` calls.

    ``tools``: the request's tools (OpenAI dicts), for vLLM's schema coercion of whole outputs.
    ``reasoning``: a ``mistral`` reasoning parser runs first (the vocabulary has [THINK]); vLLM
    then reads [THINK]/[/THINK] in the content too (a stray [/THINK] is dropped, text after a
    stray [THINK] becomes reasoning). Without it they are plain text, as in vLLM.
    """

    name = "mistral"
    keeps_special_tokens = True  # vLLM's Mistral adjust_request turns skipping off
    engine_based = True
    # vLLM holds forced Mistral calls to a schema of its own and reads them with this parser
    # (not its generic JSON path); not reproduced yet.
    forced_calls_supported = False

    @classmethod
    def for_request(cls, context: ParserContext) -> ToolParser:  # type: ignore[override]
        # The vocabulary picks the format: [ARGS] means v11+ calls, else the JSON list.
        return mistral_tool_parser(
            context.vocab,
            tools=list(context.tools or []),
            reasoning=context.reasoning_parser == "mistral",
        )

    def __init__(
        self, *, tools: list[dict[str, Any]] | None = None, reasoning: bool = False
    ) -> None:
        self._engine = MistralEngine(think=reasoning, tools=tools)
        self._stream_engine = MistralEngine(think=reasoning, tools=tools)

    def extract(self, text: str) -> ToolCallResult:
        return self._engine.extract_calls(text)

    def feed(self, delta_text: str) -> DeltaMessage | None:
        return self._stream_engine.stream(delta_text)

    def finish(self) -> DeltaMessage | None:
        return self._stream_engine.finish_stream()


class _LegacyState(Enum):
    WAITING_FOR_TOOL_START = auto()
    WAITING_FOR_TOOL_KEY = auto()
    PARSING_NAME = auto()
    PARSING_NAME_COMPLETED = auto()
    WAITING_FOR_ARGUMENTS_START = auto()
    PARSING_ARGUMENTS = auto()
    PARSING_ARGUMENTS_COMPLETED = auto()
    TOOL_COMPLETE = auto()
    ALL_TOOLS_COMPLETE = auto()


# Per state, after which structural characters a delta is cut before it goes to the JSON
# parser, so that the state seen after each piece says what that piece was.
_STOP_AFTER: dict[_LegacyState, str] = {
    _LegacyState.WAITING_FOR_TOOL_START: "{",
    _LegacyState.WAITING_FOR_TOOL_KEY: ":{}",
    _LegacyState.PARSING_NAME: ",]}",
    _LegacyState.WAITING_FOR_ARGUMENTS_START: "{}",
    _LegacyState.PARSING_ARGUMENTS: "}",
    _LegacyState.PARSING_ARGUMENTS_COMPLETED: "}]",
    _LegacyState.PARSING_NAME_COMPLETED: "}]",
    _LegacyState.TOOL_COMPLETE: "{]",
}
_LIST_RE = re.compile(r"\[{.*}\]", re.DOTALL)


def _legacy_calls(parsed: Any) -> list[ToolCall]:
    """vLLM's ``_pre_v11_function_calls``: a bare object is one call, non-call entries are
    skipped, a missing name is ``""``, string arguments are kept as they are."""
    entries = [parsed] if isinstance(parsed, dict) else parsed
    if not isinstance(entries, list):
        return []
    calls: list[ToolCall] = []
    for entry in entries:
        if not isinstance(entry, dict) or ("name" not in entry and "arguments" not in entry):
            continue
        name, arguments = entry.get("name"), entry.get("arguments")
        if arguments is None:
            arguments = "{}"
        elif not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        calls.append(
            ToolCall(
                name=name if isinstance(name, str) else "",
                arguments=arguments,
                id=make_mistral_tool_call_id(),
            )
        )
    return calls


class MistralPreV11ToolParser(ToolParser):
    """Pre-v11 ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` calls (vLLM's legacy
    path in ``MistralParser``, used when the vocabulary has no ``[ARGS]``).

    Non-streaming: content is the text before the marker (``None`` if blank); the first JSON
    value after it (else the first ``[{...}]`` in it) holds the calls; text after is dropped.
    When no call is found the content is the text after the marker, stripped (what was before
    is lost, as in vLLM). Streaming: content passes through until a delta holds the marker;
    then the JSON goes through ``ijson`` piece by piece, names are sent whole, argument objects
    as their raw text (string arguments decoded), and text after the list is content again. A
    JSON error silences the rest of the stream.
    """

    name = "mistral"
    keeps_special_tokens = True  # vLLM's Mistral adjust_request turns skipping off
    forced_calls_supported = False  # as MistralToolParser

    def __init__(self) -> None:
        self._started = False
        self._state = _LegacyState.WAITING_FOR_TOOL_START
        self._tool_id = -1
        self._new_tool = False
        self._name: str | None = None
        self._string_args: str | None = None
        self._pending_id: str | None = None
        self._json = ijson.parse_coro(self._on_events())

    def extract(self, text: str) -> ToolCallResult:
        if TOOL_CALLS not in text:
            return ToolCallResult(False, [], text or None)
        # Repeated markers count as one; the JSON is the first non-blank segment.
        before, *segments = text.split(TOOL_CALLS)
        body = next((s.strip() for s in segments if s.strip()), "")
        try:
            parsed, _ = json.JSONDecoder().raw_decode(body)
        except json.JSONDecodeError:
            found = _LIST_RE.findall(body)
            try:
                parsed = json.loads(found[0]) if found else None
            except json.JSONDecodeError:
                parsed = None
        calls = _legacy_calls(parsed)
        if not calls:
            return ToolCallResult(False, [], body or None)
        return ToolCallResult(True, calls, before if before.strip() else None)

    def feed(self, delta_text: str) -> DeltaMessage | None:
        if TOOL_CALLS in delta_text:
            self._started = True
        if not self._started:
            return DeltaMessage(content=delta_text)
        try:
            return self._stream(delta_text)
        except Exception:
            return None  # vLLM logs it and sends nothing; ijson stays failed afterwards

    @ijson.coroutine
    def _on_events(self) -> Generator[None, tuple[str, str, Any], None]:
        """vLLM's ``update_stream_state_pre_v11_tokenizer``: ijson events to states."""
        bare_object = False
        s = _LegacyState
        while True:
            prefix, event, value = yield
            if prefix == "" and event == "start_map":
                bare_object = True  # a lone call object: read as the list's only item
            if bare_object:
                prefix = f"item.{prefix}" if prefix else "item"
            if prefix == "item" and event == "start_map":
                self._state, self._new_tool = s.WAITING_FOR_TOOL_KEY, True
            if prefix == "item" and event == "map_key" and value == "name":
                self._state = s.PARSING_NAME
            if prefix == "item.name" and event == "string":
                self._name, self._state = value, s.PARSING_NAME_COMPLETED
            if prefix == "item" and event == "map_key" and value == "arguments":
                self._state = s.WAITING_FOR_ARGUMENTS_START
            if prefix == "item.arguments" and event == "start_map":
                self._state = s.PARSING_ARGUMENTS
            if prefix == "item.arguments" and event == "end_map":
                self._state = s.PARSING_ARGUMENTS_COMPLETED
            if prefix == "item.arguments" and event == "string":
                self._string_args = value
            if prefix == "item" and event == "end_map":
                self._state = s.ALL_TOOLS_COMPLETE if bare_object else s.TOOL_COMPLETE
            if prefix == "" and event == "end_array":
                self._state = s.ALL_TOOLS_COMPLETE

    def _stream(self, delta_text: str) -> DeltaMessage | None:
        content = None
        pieces: list[DeltaToolCall] = []
        current = DeltaToolCall(self._tool_id, type="function")
        modified = False
        if TOOL_CALLS in delta_text:
            before, *after = delta_text.split(TOOL_CALLS)
            content = before or None
            delta_text = "".join(after)
        s = _LegacyState
        while delta_text:
            state_before = self._state
            if self._state == s.ALL_TOOLS_COMPLETE:
                content, delta_text = delta_text, ""
                break
            piece, delta_text = _cut(delta_text, _STOP_AFTER[self._state])
            self._json.send(piece.encode("utf-8"))
            if self._new_tool:
                self._new_tool = False
                if modified:
                    pieces.append(self._finish_piece(current))
                modified = False
                self._tool_id += 1
                self._pending_id = make_mistral_tool_call_id()
                current = DeltaToolCall(self._tool_id, type="function")
            if self._name is not None:
                modified, current.name, self._name = True, self._name, None
            if self._string_args is not None:
                modified, current.arguments, self._string_args = True, self._string_args, None
            if self._state == s.PARSING_NAME_COMPLETED:
                self._state = s.WAITING_FOR_TOOL_KEY
            if self._state in (s.PARSING_ARGUMENTS, s.PARSING_ARGUMENTS_COMPLETED):
                if self._state == s.PARSING_ARGUMENTS_COMPLETED:
                    self._state = s.WAITING_FOR_TOOL_KEY
                modified = True
                current.arguments = (current.arguments or "") + piece
                if state_before != s.PARSING_ARGUMENTS:
                    current.arguments = current.arguments.lstrip()  # the object's first piece
        if modified:
            pieces.append(self._finish_piece(current))
        if content or pieces:
            return DeltaMessage(content=content or None, tool_calls=pieces)
        # vLLM sends an empty delta once the list closed.
        return DeltaMessage() if self._state == s.ALL_TOOLS_COMPLETE else None

    def _finish_piece(self, piece: DeltaToolCall) -> DeltaToolCall:
        if self._pending_id is not None:
            piece.id, self._pending_id = self._pending_id, None
        return piece


def _cut(text: str, stops: str) -> tuple[str, str]:
    """``text`` cut after its first character in ``stops`` (all of it if none)."""
    for i, ch in enumerate(text):
        if ch in stops:
            return text[: i + 1], text[i + 1 :]
    return text, ""


def mistral_tool_parser(
    vocab: Container[str], *, tools: list[dict[str, Any]] | None = None, reasoning: bool = False
) -> ToolParser:
    """The ``mistral`` tool parser vLLM uses with this (Hugging Face) vocabulary."""
    if ARGS not in vocab:
        return MistralPreV11ToolParser()
    return MistralToolParser(tools=tools, reasoning=reasoning and THINK_START in vocab)
