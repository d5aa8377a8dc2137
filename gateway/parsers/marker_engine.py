"""A text-only port of vLLM 0.32's declarative parser engine (``vllm/parser/engine/``).

vLLM describes several model formats (Gemma 4, Kimi K2, MiniMax M2, ...) as a grammar of marker
strings ("terminals") and a state machine over them, and runs every such grammar through one
engine: ``IncrementalLexer`` (``incremental_lexer.py``), ``StreamingParserEngine``
(``streaming_parser_engine.py``), ``ParserEngine`` (``parser_engine.py``) and the adapters that
serve an engine as a ``--reasoning-parser`` or a ``--tool-call-parser`` (``adapters.py``, run by
``DelegatingParser`` in ``vllm/parser/abstract_parser.py``). This module reproduces that engine
closely enough that the output, whole and streamed, is vLLM's; the family modules
(``gemma4.py``, ``kimi_k2.py``, ``minimax_m2_reasoning.py``, ``mistral_tool.py``, ...) only
supply a ``Grammar`` and their model-specific hooks.

Text-only streaming. vLLM matches the grammar's special-token markers by token id while
streaming, and treats the same text arriving any other way (cut across two deltas) as plain
text. A marker token always lands whole inside one detokenized delta, so here a token marker
counts while streaming when its whole text lies inside one delta. The model's other special
tokens (``special_tokens``) are dropped from the text, as vLLM drops every special token its
grammar does not know.

One known difference, in a reasoning parser chained to a tool parser: vLLM hands the tool
parser the delta that ended reasoning with only the token ids after that delta's last
reasoning-end marker, so when such a delta holds more reasoning markers after the end (say
``<|tool_call>`` then ``<channel|>`` in one delta), the markers before the last one are plain
text to vLLM's tool parser but markers to ours. Token-by-token streams never do this.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Any

from gateway.parsers.base import (
    DeltaMessage,
    DeltaToolCall,
    ParserContext,
    ReasoningParser,
    ReasoningResult,
    ToolCall,
    ToolCallResult,
    ToolParser,
    make_tool_call_id,
)

CONTENT_TERMINAL = "__CONTENT__"
DROP_TERMINAL = "__DROP__"


class State(Enum):
    CONTENT = auto()
    REASONING = auto()
    TOOL_PREAMBLE = auto()
    TOOL_NAME = auto()
    TOOL_ARGS = auto()
    TOOL_BETWEEN = auto()


TOOL_STATES = frozenset({State.TOOL_PREAMBLE, State.TOOL_NAME, State.TOOL_ARGS, State.TOOL_BETWEEN})
PLAIN_STATES = frozenset({State.CONTENT, State.REASONING})


class Ev(Enum):
    TEXT = auto()
    REASONING = auto()
    REASONING_START = auto()
    REASONING_END = auto()
    TOOL_START = auto()
    TOOL_NAME = auto()
    ARGS = auto()
    TOOL_END = auto()


REASONING_MARK_EVENTS = frozenset({Ev.REASONING_START, Ev.REASONING_END})


@dataclass
class Event:
    type: Ev
    value: str = ""
    index: int = -1


Transition = tuple[State, tuple[Ev, ...]]


def _default_content_events() -> dict[State, Ev]:
    return {
        State.CONTENT: Ev.TEXT,
        State.REASONING: Ev.REASONING,
        State.TOOL_NAME: Ev.TOOL_NAME,
        State.TOOL_ARGS: Ev.ARGS,
    }


@dataclass(frozen=True)
class Grammar:
    """vLLM's ``ParserEngineConfig``, for the features the ported families use."""

    terminals: Mapping[str, str]
    # Terminals that are single tokens: vLLM matches them by token id while streaming.
    token_terminals: Mapping[str, str]
    transitions: Mapping[tuple[State, str], Transition]
    initial_state: State = State.CONTENT
    wait_for_reasoning: bool | None = None
    content_events: Mapping[State, Ev] = field(default_factory=_default_content_events)
    arg_converter: Callable[[str, bool], str] | None = None
    stream_arg_deltas: bool = True
    tool_args_json: bool = True
    arg_structural_chars: frozenset[str] | None = None
    preserve_tokens: frozenset[str] = frozenset()
    # Tokens that start a turn: a prompt's reasoning markers before them are history.
    turn_boundary_tokens: frozenset[str] = frozenset()
    strip_trailing_reasoning_whitespace: bool = True
    drop_whitespace_only_content_before_tools: bool = True
    strip_content_whitespace_with_tools: bool = True
    validate_tool_names: bool = False

    @property
    def has_reasoning(self) -> bool:
        return (
            "THINK_END" in self.token_terminals
            or "THINK_START" in self.terminals
            or "THINK_END" in self.terminals
            or self.initial_state == State.REASONING
        )

    @property
    def waits_for_reasoning(self) -> bool:
        """Whether generation starts inside reasoning after a prompt without markers."""
        if self.wait_for_reasoning is None:
            return self.initial_state == State.REASONING
        return self.wait_for_reasoning

    def reasoning_end_tokens(self) -> frozenset[str]:
        """The token markers that end reasoning (vLLM's ``_derive_reasoning_end_token_ids``);
        empty when reasoning can also end some other way."""
        ends: dict[str, State] = {}
        for (state, terminal), (next_state, events) in self.transitions.items():
            if state != State.REASONING:
                continue
            if Ev.REASONING_END in events:
                ends.setdefault(terminal, next_state)
            elif next_state != State.REASONING:
                return frozenset()
        tokens: set[str] = set()
        for terminal, next_state in ends.items():
            if terminal in self.token_terminals:
                tokens.add(self.token_terminals[terminal])
            elif next_state == State.CONTENT:
                return frozenset()
        return frozenset(tokens)

    def prompt_ends_reasoning(self, prompt_tokens: Sequence[str]) -> bool:
        """vLLM's ``ParserEngine.is_reasoning_end`` on the prompt's tokens: the last reasoning
        marker of the current turn decides, and a turn without one has ended reasoning when the
        grammar does not wait for it."""
        ends = self.reasoning_end_tokens()
        start = self.token_terminals.get("THINK_START")
        opener = self.transitions.get((self.initial_state, "THINK_START"))
        start_opens = opener is not None and opener[0] == State.REASONING
        for token in reversed(prompt_tokens):
            if token in ends:
                return True
            if token == start:
                if start_opens:
                    return False
                break
            if token in self.turn_boundary_tokens:
                break
        return not self.waits_for_reasoning


# ── Lexer (``IncrementalLexer``) ────────────────────────────────────────────────────────────


class Lexer:
    """Splits text into terminals and content, holding back a tail that may start a terminal."""

    def __init__(self, literals: Sequence[tuple[str, str]]) -> None:
        self._literals = list(literals)  # (literal, terminal name)
        self._first_chars = frozenset(lit[0] for lit, _ in self._literals)
        self._prefixes = frozenset(lit[:i] for lit, _ in self._literals for i in range(1, len(lit)))
        self._by_first: dict[str, list[tuple[str, str]]] = {}
        for lit, name in self._literals:
            self._by_first.setdefault(lit[0], []).append((lit, name))
        self.buffer = ""

    def feed(self, text: str) -> list[tuple[str, str]]:
        if not self.buffer and self._first_chars.isdisjoint(text):
            return [(CONTENT_TERMINAL, text)]
        self.buffer += text
        return self._drain(final=False)

    def flush(self) -> list[tuple[str, str]]:
        tokens = self._drain(final=True) if self.buffer else []
        if self.buffer:
            tokens.append((CONTENT_TERMINAL, self.buffer))
            self.buffer = ""
        return tokens

    def _longest_match(self) -> tuple[str, str] | None:
        best: tuple[str, str] | None = None
        for lit, name in self._by_first.get(self.buffer[0], ()):
            if self.buffer.startswith(lit) and (best is None or len(lit) > len(best[1])):
                best = (name, lit)
        return best

    def _drain(self, *, final: bool) -> list[tuple[str, str]]:
        tokens: list[tuple[str, str]] = []
        while self.buffer:
            if self._first_chars.isdisjoint(self.buffer):
                tokens.append((CONTENT_TERMINAL, self.buffer))
                self.buffer = ""
                break
            best = self._longest_match()
            may_grow = best is None or self._longer_literal_possible(len(best[1]))
            if self.buffer in self._prefixes and not final and may_grow:
                break  # the buffer may still become a (longer) terminal: wait for more text
            if best is not None:
                tokens.append(best)
                self.buffer = self.buffer[len(best[1]) :]
                continue
            end = self._content_boundary() or 1
            tokens.append((CONTENT_TERMINAL, self.buffer[:end]))
            self.buffer = self.buffer[end:]
        return tokens

    def _longer_literal_possible(self, matched: int) -> bool:
        return any(
            len(lit) > matched and lit.startswith(self.buffer)
            for lit, _ in self._by_first.get(self.buffer[0], ())
        )

    def _content_boundary(self) -> int:
        buf = self.buffer
        for i in range(1, len(buf)):
            if buf[i] not in self._first_chars:
                continue
            rest = len(buf) - i
            for lit, _ in self._literals:
                n = min(rest, len(lit))
                if buf[i : i + n] == lit[:n]:
                    return i
        return len(buf)


# ── State machine (``StreamingParserEngine``) ───────────────────────────────────────────────


class Machine:
    """Terminals and content in, semantic events out."""

    def __init__(self, grammar: Grammar, special_tokens: Collection[str]) -> None:
        self.grammar = grammar
        known = (
            set(grammar.token_terminals.values())
            | set(grammar.terminals.values())
            | grammar.preserve_tokens
        )
        drops = sorted(set(special_tokens) - known)
        self._has_drops = bool(drops)
        literals = [(lit, name) for name, lit in grammar.terminals.items()]
        literals += [(lit, DROP_TERMINAL) for lit in drops]
        self._lexer = Lexer(literals)
        token_names = dict(grammar.token_terminals)
        self._token_literals = {lit: name for name, lit in token_names.items()}
        self._token_literals.update({lit: DROP_TERMINAL for lit in drops})
        self._strict = frozenset(self._token_literals.values())
        self._token_re = (
            re.compile(
                "|".join(re.escape(t) for t in sorted(self._token_literals, key=len, reverse=True))
            )
            if self._token_literals
            else None
        )
        transitions = grammar.transitions
        self._tool_terminals = frozenset(
            t for (s, t), (nxt, _) in transitions.items() if nxt in TOOL_STATES or s in TOOL_STATES
        )
        self._tool_exits = frozenset(
            t
            for (s, t), (nxt, _) in transitions.items()
            if s in TOOL_STATES and nxt not in TOOL_STATES
        )
        self._reasoning_markup = self._reasoning_markup_terminals()
        self.skip_tool_parsing = False
        self.skip_reasoning_parsing = False
        self.reset()

    def _reasoning_markup_terminals(self) -> frozenset[str]:
        """Markers that only ever open or close reasoning (vLLM's bypass set when no reasoning
        parser is configured); one marker with another role disables the bypass entirely."""
        transitions = self.grammar.transitions
        markers = frozenset(
            t
            for (s, t), (nxt, _) in transitions.items()
            if State.REASONING in (s, nxt) and nxt not in TOOL_STATES
        )
        for (s, t), (nxt, events) in transitions.items():
            if t in markers and (
                s not in PLAIN_STATES
                or nxt not in PLAIN_STATES
                or not REASONING_MARK_EVENTS.issuperset(events)
            ):
                return frozenset()
        return markers

    def reset(self, initial_state: State | None = None) -> None:
        self.state = initial_state or self.grammar.initial_state
        self.tool_index = -1
        self._streamed = False
        self._lexer.buffer = ""
        self._in_skipped_tool_span = False
        self._args_buffer = ""
        self._reset_args_scan()

    def _reset_args_scan(self) -> None:
        self._args_safe_end = 0
        self._args_depth = 0
        self._args_in_string = False
        self._args_escape = False

    def feed(self, text: str, *, streaming: bool) -> list[Event]:
        """Events for the next text; ``streaming`` texts are deltas whose whole token markers
        count as terminals (vLLM's token ids) while cut ones are plain text."""
        if streaming and text:
            self._streamed = True
        if not streaming or self._token_re is None:
            return self._lex(self._lexer.feed(text))
        events: list[Event] = []
        pos = 0
        for match in self._token_re.finditer(text):
            if match.start() > pos:
                events += self._lex(self._lexer.feed(text[pos : match.start()]))
            events += self._lex(self._lexer.flush())
            events += self._on_terminal(self._token_literals[match.group()], match.group())
            pos = match.end()
        if pos < len(text):
            events += self._lex(self._lexer.feed(text[pos:]))
        return events

    def finish(self) -> list[Event]:
        events = self._lex(self._lexer.flush())
        if self._args_buffer:
            events.append(Event(Ev.ARGS, self._args_buffer, self.tool_index))
            self._args_buffer = ""
            self._args_safe_end = 0
        if self.state in TOOL_STATES:
            if self.tool_index >= 0:
                events.append(Event(Ev.TOOL_END, index=self.tool_index))
            self.state = State.CONTENT
        elif self.state == State.REASONING:
            events.append(Event(Ev.REASONING_END, index=self.tool_index))
            self.state = State.CONTENT
        return events

    def _lex(self, tokens: list[tuple[str, str]]) -> list[Event]:
        events: list[Event] = []
        for name, value in tokens:
            # Once streaming, token markers found by the text lexer were cut across deltas.
            if name == CONTENT_TERMINAL or (self._streamed and name in self._strict):
                if value:
                    events += self._emit(value)
            else:
                events += self._on_terminal(name, value)
        return events

    def _on_terminal(self, terminal: str, value: str) -> list[Event]:
        transition = self.grammar.transitions.get((self.state, terminal))
        if transition is None:
            if self._has_drops and terminal == DROP_TERMINAL:
                return []
            if self.skip_tool_parsing and terminal in self._tool_exits:
                self._in_skipped_tool_span = False
            return self._emit(value)
        if self.skip_reasoning_parsing and terminal in self._reasoning_markup:
            return self._emit(value)
        if self.skip_tool_parsing and terminal in self._tool_terminals:
            skipped = self._skip_tool_terminal(terminal, transition, value)
            if skipped is not None:
                return skipped
        return self._apply(transition, value)

    def _skip_tool_terminal(
        self, terminal: str, transition: Transition, value: str
    ) -> list[Event] | None:
        """A tool marker read by the reasoning pass: text, but it may end reasoning."""
        next_state, events = transition
        is_opener = next_state in TOOL_STATES
        is_exit = terminal in self._tool_exits
        if is_exit and not is_opener and not self._in_skipped_tool_span:
            return None  # a closer outside a tool span takes its normal transition
        if is_opener:
            self._in_skipped_tool_span = True
        elif is_exit:
            self._in_skipped_tool_span = False
        if Ev.REASONING_END in events:
            self.state = State.CONTENT
            return [
                Event(Ev.REASONING_END, value, self.tool_index),
                Event(Ev.TEXT, value, self.tool_index),
            ]
        content_type = self.grammar.content_events.get(self.state)
        return [Event(content_type, value, self.tool_index)] if content_type else []

    def _emit(self, text: str) -> list[Event]:
        if self.state == State.TOOL_ARGS:
            if self.grammar.tool_args_json:
                events: list[Event] = []
                for ch in text:
                    events += self._feed_args_char(ch)
                return events
            return [Event(Ev.ARGS, text, self.tool_index)]
        content_type = self.grammar.content_events.get(self.state)
        return [Event(content_type, text, self.tool_index)] if content_type else []

    def _apply(self, transition: Transition, value: str) -> list[Event]:
        next_state, event_types = transition
        events: list[Event] = []
        if self.state == State.TOOL_ARGS and next_state != State.TOOL_ARGS and self._args_buffer:
            events.append(Event(Ev.ARGS, self._args_buffer, self.tool_index))
            self._args_buffer = ""
        self.state = next_state
        for event_type in event_types:
            if event_type == Ev.TOOL_START:
                self.tool_index += 1
            if event_type == Ev.TEXT and not value:
                continue
            events.append(Event(event_type, value, self.tool_index))
        if self.state == State.TOOL_ARGS:
            self._reset_args_scan()
        return events

    def _feed_args_char(self, ch: str) -> list[Event]:
        """JSON arguments stream as they come, except a closing brace that may end them."""
        self._args_buffer += ch
        if self._args_escape:
            self._args_escape = False
        elif self._args_in_string:
            if ch == "\\":
                self._args_escape = True
            elif ch == '"':
                self._args_in_string = False
        elif ch == '"':
            self._args_in_string = True
        elif ch in "{[":
            self._args_depth += 1
        elif ch in "}]":
            if self._args_depth > 0:
                self._args_depth -= 1
            if self._args_depth == 0:
                return []  # held until a later character or the end proves it is not the last
        self._args_safe_end = len(self._args_buffer)
        to_emit = self._args_buffer[: self._args_safe_end]
        self._args_buffer = self._args_buffer[self._args_safe_end :]
        self._args_safe_end = 0
        return [Event(Ev.ARGS, to_emit, self.tool_index)]


# ── Tool schemas (``vllm/tool_parsers/utils.py``) ───────────────────────────────────────────


def find_tool_properties(tools: Sequence[Mapping[str, Any]] | None, name: str) -> dict:
    """The ``properties`` of the named tool's parameters in OpenAI chat ``tools``, or {}."""
    for tool in tools or ():
        function = tool.get("function") if tool.get("type", "function") == "function" else None
        if isinstance(function, Mapping) and function.get("name") == name:
            properties = (function.get("parameters") or {}).get("properties", {})
            # Malformed ones (the gateway does not validate tools) coerce nothing.
            return properties if isinstance(properties, dict) else {}
    return {}


def find_tool_name(tools: Sequence[Mapping[str, Any]] | None, name: str) -> bool:
    for tool in tools or ():
        function = tool.get("function") if tool.get("type", "function") == "function" else None
        if isinstance(function, Mapping) and function.get("name") == name:
            return True
    return False


_ENUM_TYPES = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"))


def extract_types_from_schema(schema: Any) -> list[str]:
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
            types.add(_enum_type(value))
    for choice_field in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(choice_field), list):
            for choice in schema[choice_field]:
                types.update(extract_types_from_schema(choice))
    return list(types) if types else ["string"]


def _enum_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return next(name for kind, name in _ENUM_TYPES if isinstance(value, kind))


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
_MISSING = object()


def _is_json_finite(obj: Any) -> bool:
    if isinstance(obj, float):
        return math.isfinite(obj)
    if isinstance(obj, list):
        return all(_is_json_finite(v) for v in obj)
    if isinstance(obj, dict):
        return all(_is_json_finite(v) for v in obj.values())
    return True


def _coerce_as(value: str, kind: str) -> Any:
    """``value`` as JSON type ``kind``, or ``_MISSING``."""
    if kind == "null":
        return None if value.lower() == "null" else _MISSING
    if kind == "string":
        return value
    if kind == "integer":
        try:
            return int(value)
        except ValueError:
            return _MISSING
    if kind == "number":
        try:
            number = float(value)
        except ValueError:
            return _MISSING
        if not math.isfinite(number):
            return _MISSING
        return number if number != int(number) else int(number)
    if kind == "boolean":
        lowered = value.lower().strip()
        return {"true": True, "1": True, "false": False, "0": False}.get(lowered, _MISSING)
    try:
        parsed = json.loads(value)
    except ValueError:
        return _MISSING
    return parsed if _is_json_finite(parsed) else _MISSING


def coerce_to_schema_type(value: str, schema_types: list[str]) -> Any:
    """vLLM's best-effort coercion of a raw string to the first fitting schema type."""
    normalized = {_TYPE_ALIASES.get(t.strip().lower(), t.strip().lower()) for t in schema_types}
    for kind in ("null", "integer", "number", "boolean", "object", "array", "string"):
        if kind in normalized and (coerced := _coerce_as(value, kind)) is not _MISSING:
            return coerced
    try:
        parsed = json.loads(value)
    except ValueError:
        return value
    return parsed if _is_json_finite(parsed) else value


def _coerce_value(value: Any, schema: dict) -> tuple[Any, bool]:
    if isinstance(value, str):
        coerced = coerce_to_schema_type(value, extract_types_from_schema(schema))
        return (coerced, True) if coerced is not value else (value, False)
    if isinstance(value, dict):
        nested = schema.get("properties")
        if isinstance(nested, dict):
            return value, _coerce_dict(value, nested)
        return value, False
    if isinstance(value, list):
        items = schema.get("items")
        changed = False
        if isinstance(items, dict):
            for i, item in enumerate(value):
                coerced, item_changed = _coerce_value(item, items)
                if item_changed:
                    value[i] = coerced
                    changed = True
        return value, changed
    as_str = json.dumps(value, ensure_ascii=False)
    coerced = coerce_to_schema_type(as_str, extract_types_from_schema(schema))
    if type(coerced) is not type(value) or coerced != value:
        return coerced, True
    return value, False


def _coerce_dict(args: dict, properties: dict) -> bool:
    changed = False
    for key, value in args.items():
        prop = properties.get(key)
        if isinstance(prop, dict):
            coerced, value_changed = _coerce_value(value, prop)
            if value_changed:
                args[key] = coerced
                changed = True
    return changed


def _streamable_string_keys(properties: dict) -> set[str] | None:
    if not properties:
        return None
    return {k for k, s in properties.items() if set(extract_types_from_schema(s)) == {"string"}}


def _safe_arg_prefix(json_str: str, string_keys: set[str] | None) -> str:
    """The prefix of the arguments JSON that later text cannot change (vLLM streams only
    that): up to the last top-level value, plus an open string value of a string field."""
    last_colon, last_key, pending_key = -1, None, None
    in_string = escape = False
    string_start, depth = -1, 0
    for i, c in enumerate(json_str):
        if escape:
            escape = False
        elif in_string:
            if c == "\\":
                escape = True
            elif c == '"':
                in_string = False
                if depth == 1 and string_start >= 0:
                    pending_key = json_str[string_start + 1 : i]
        elif c == '"':
            in_string, string_start = True, i
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
        elif c == ":" and depth == 1:
            last_colon, last_key, pending_key = i, pending_key, None
    if last_colon < 0:
        return ""
    end = last_colon + 1
    while end < len(json_str) and json_str[end] in " \t\n\r":
        end += 1
    if end >= len(json_str) or json_str[end] != '"':
        return json_str[:end]
    if string_keys is not None and last_key not in string_keys:
        return json_str[:end]
    escape = False
    for i in range(end + 1, len(json_str)):
        if escape:
            escape = False
        elif json_str[i] == "\\":
            escape = True
        elif json_str[i] == '"':
            return json_str[:i]
    return json_str


# ── Events to messages (``ParserEngine``) ───────────────────────────────────────────────────


@dataclass
class Slot:
    """One tool call being assembled."""

    id: str = ""
    name: str = ""
    args: str = ""
    name_sent: bool = False
    string_keys: set[str] | None = None
    streamed_json: str = ""


_NAME_RE = re.compile(r'"name"\s*:\s*"([^"]*)"')


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
            calls = _coalesce(calls)
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
        slot.string_keys = _streamable_string_keys(find_tool_properties(self.tools, name))
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
        match = _NAME_RE.search(self.slots[index].args)
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
        if _coerce_dict(args, properties):
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
        safe = _safe_arg_prefix(current, slot.string_keys)
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
        return _name_and_args(raw_body)

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


def _name_and_args(raw_body: str) -> tuple[Any, str]:
    raw_body = raw_body.strip()
    try:
        parsed = json.loads(raw_body)
    except ValueError:
        return "", raw_body
    if not isinstance(parsed, dict):
        return "", raw_body
    name = parsed.get("name", "")
    for key in ("arguments", "parameters"):
        if key in parsed:
            value = parsed[key]
            return name, value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    without_name = {k: v for k, v in parsed.items() if k != "name"}
    return name, json.dumps(without_name, ensure_ascii=False)


def _coalesce(calls: list[DeltaToolCall]) -> list[DeltaToolCall]:
    """One piece per call index, as vLLM merges them."""
    merged: dict[int, DeltaToolCall] = {}
    for piece in calls:
        existing = merged.get(piece.index)
        if existing is None:
            merged[piece.index] = piece
            continue
        existing.id = existing.id if existing.id is not None else piece.id
        existing.type = existing.type if existing.type is not None else piece.type
        existing.name = existing.name if existing.name is not None else piece.name
        if piece.arguments is not None:
            existing.arguments = (existing.arguments or "") + piece.arguments
    return calls if len(merged) == len(calls) else list(merged.values())


# ── Served as parsers (``adapters.py`` under ``DelegatingParser``) ─────────────────────────


def suppresses_calls(context: ParserContext) -> bool:
    """vLLM's ``ParserEngine._check_skip_tool_parsing``: tool_choice "none" with tools offered
    suppresses the calls."""
    return context.tool_choice == "none" and bool(context.tools)


class EngineToolParser(ToolParser):
    """An engine served as vLLM's ``--tool-call-parser``: it reads content, starting outside
    reasoning. ``after_reasoning_parser`` says whether a reasoning parser runs first: without one
    vLLM passes reasoning-only markers through as content instead of consuming them.
    ``suppress_calls`` (see ``suppresses_calls``): calls are read but never reported."""

    keeps_special_tokens = True  # the engines' markers are special tokens
    engine_based = True

    def __init__(
        self, engine: Engine, *, after_reasoning_parser: bool = False, suppress_calls: bool = False
    ) -> None:
        self._engine = engine
        engine.machine.skip_reasoning_parsing = not after_reasoning_parser
        engine.suppress_calls = suppress_calls

    def extract(self, text: str) -> ToolCallResult:
        _, content, calls = self._engine.single_pass(text, State.CONTENT)
        if calls:
            # vLLM's serving layer nulls whitespace-only content next to calls.
            return ToolCallResult(True, calls, content if content and content.strip() else None)
        return ToolCallResult(False, [], content or None)

    def feed(self, delta_text: str) -> DeltaMessage | None:
        self._engine.initialize_streaming(State.CONTENT)
        return self._engine.stream(delta_text)

    def finish(self) -> DeltaMessage | None:
        if not self._engine.streaming_initialized:
            return None
        return self._engine.finish_streaming()


class EngineReasoningParser(ReasoningParser):
    """An engine served as vLLM's ``--reasoning-parser`` (tool markers read as content).

    Fed on its own, it takes the prompt to hold no reasoning markers: output opens in reasoning
    exactly when the grammar waits for it (``prompt_ends_reasoning`` says what vLLM decides from
    the real prompt; a caller that finds reasoning ended does not feed this parser).
    """

    keeps_special_tokens = True  # vLLM's engine adapters always turn skipping off
    engine_based = True

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        engine.machine.skip_tool_parsing = True
        self._ended = not engine.grammar.waits_for_reasoning

    @property
    def reasoning_ended(self) -> bool:
        return self._ended

    def prompt_ends_reasoning(self, prompt_tokens: Sequence[str]) -> bool:
        return self._engine.grammar.prompt_ends_reasoning(prompt_tokens)

    def extract(self, text: str) -> ReasoningResult:
        reasoning, content = self._engine.extract_reasoning(text)
        return ReasoningResult(reasoning, content)

    def feed(self, delta_text: str) -> DeltaMessage | None:
        if self._ended:
            return DeltaMessage(content=delta_text) if delta_text else None
        engine = self._engine
        engine.initialize_streaming()
        delta = engine.stream(delta_text)
        if not engine.reasoning_ended:
            return delta
        self._ended = True
        # The engine holds text back (a possible marker prefix); vLLM flushes it into the
        # content of the delta that ends reasoning, and passes later deltas through raw.
        flushed = engine.finish_streaming()
        content = ((delta.content if delta else None) or "") + (
            (flushed.content if flushed else None) or ""
        )
        if content:
            delta = delta or DeltaMessage()
            delta.content = content
        return delta

    def finish(self) -> DeltaMessage | None:
        if self._ended or not self._engine.streaming_initialized:
            return None
        return self._engine.finish_streaming()
