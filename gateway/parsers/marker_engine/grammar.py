"""A parser's grammar: marker strings ("terminals") and a state machine over them (vLLM's
``ParserEngineConfig``), and the events the machine emits."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum, auto


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
