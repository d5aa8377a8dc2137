"""Terminals and content into semantic events (vLLM's ``StreamingParserEngine``)."""

from __future__ import annotations

import re
from collections.abc import Collection

from gateway.parsers.marker_engine.grammar import (
    PLAIN_STATES,
    REASONING_MARK_EVENTS,
    TOOL_STATES,
    Ev,
    Event,
    Grammar,
    State,
    Transition,
)
from gateway.parsers.marker_engine.lexer import CONTENT_TERMINAL, Lexer

# The terminal name of the model's other special tokens, which are dropped from the text.
DROP_TERMINAL = "__DROP__"


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
