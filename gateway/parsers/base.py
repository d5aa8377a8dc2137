"""Interfaces and output types shared by the reasoning and tool-call parsers.

The parsers reproduce what vLLM 0.32's OpenAI server returns with ``--reasoning-parser`` and
``--tool-call-parser`` (its ``DelegatingParser.parse`` / ``parse_delta``), without importing vLLM:
the outputs are small dataclasses here, not vLLM's pydantic models.

Streaming is text-only: a parser keeps the text it has seen, so a caller feeds each new text
delta and nothing else. The parsers implemented so far need no token ids because their markers
(``<think>``, ``</think>``, ``<tool_call>``, ``</tool_call>``) appear verbatim in the detokenized
text (vLLM turns ``skip_special_tokens`` off for these parsers for that reason).
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

TOOL_CALL_ID_PREFIX = "chatcmpl-tool-"


def make_tool_call_id() -> str:
    """A tool call id in vLLM's default format: the prefix then 16 random hex digits."""
    return f"{TOOL_CALL_ID_PREFIX}{uuid.uuid4().int & (2**64 - 1):016x}"


def partial_tag_overlap(text: str, tag: str) -> int:
    """Length of the longest proper prefix of ``tag`` that ends ``text`` (0 if none)."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


@dataclass
class DeltaToolCall:
    """One piece of a streamed tool call; the first piece of a call carries id, type, name."""

    index: int
    id: str | None = None
    type: str | None = None
    name: str | None = None
    arguments: str | None = None


@dataclass
class DeltaMessage:
    """What one streamed delta adds: reasoning text, content text, tool call pieces."""

    reasoning: str | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] = field(default_factory=list)


@dataclass(frozen=True)
class ParserContext:
    """What vLLM builds a request's parsers from: its tools and template kwargs, the
    tokenizer's special tokens and added-token vocabulary, and the other parser configured."""

    tools: Sequence[Mapping[str, Any]] | None = None
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    special_tokens: Collection[str] = ()
    vocab: Collection[str] = ()
    reasoning_parser: str | None = None
    tool_parser: str | None = None
    # The request's tool_choice: vLLM's engine-based tool parsers read calls under "none" but
    # suppress them (the call markup is dropped, the text around it kept as written).
    tool_choice: Any = "auto"


@dataclass(frozen=True)
class ReasoningResult:
    """A whole output split into reasoning and content (``None`` where vLLM returns null)."""

    reasoning: str | None
    content: str | None


@dataclass(frozen=True)
class ToolCall:
    """A parsed call; ``arguments`` is a JSON string, as in the OpenAI response."""

    name: str
    arguments: str
    id: str = field(default_factory=make_tool_call_id)
    type: str = "function"


@dataclass(frozen=True)
class ToolCallResult:
    """A whole output split into tool calls and the remaining content; ``failed``: the parser
    found call markup it could not read (the text then comes back as content, as in vLLM)."""

    tools_called: bool
    tool_calls: list[ToolCall]
    content: str | None
    failed: bool = False


class ReasoningParser(ABC):
    """Splits model output into reasoning and content.

    One instance per generated sequence: streaming state lives on the instance. Feed every text
    delta to ``feed`` in order, then call ``finish`` once when the sequence ends (it flushes any
    text held back while waiting to see whether a marker follows).
    """

    name: str
    # The markers as the tokenizer's added tokens spell them (None: the parser has none).
    start_marker: str | None = None
    end_marker: str | None = None
    # Whether vLLM turns skip_special_tokens off for every request (its adjust_request), so
    # that markers the tokenizer marks special still reach the parser.
    keeps_special_tokens: bool = False
    # Whether vLLM runs it on its parser engine (``engine_based_streaming``): with an engine
    # tool parser too, calls are read even under tool_choice "none" (and dropped).
    engine_based: bool = False

    @classmethod
    def for_request(cls, context: ParserContext) -> ReasoningParser:
        """A parser for one sequence of a request (some follow ``enable_thinking`` in the
        template kwargs); the default ignores the context."""
        return cls()

    @abstractmethod
    def extract(self, text: str) -> ReasoningResult:
        """Split a whole output (non-streaming)."""

    @abstractmethod
    def feed(self, delta_text: str) -> DeltaMessage | None:
        """Classify the next text delta; ``None`` when there is nothing to send yet."""

    def finish(self) -> DeltaMessage | None:
        """Flush text held back at the end of the stream."""
        return None

    @property
    @abstractmethod
    def reasoning_ended(self) -> bool:
        """Whether the stream has left the reasoning section (later deltas are content)."""

    def prompt_ends_reasoning(self, prompt_tokens: Sequence[str]) -> bool:
        """vLLM's ``is_reasoning_end`` on the prompt (``prompt_tokens``: its tokens' strings,
        added tokens spelt as themselves): the last marker is the end marker. True means
        generation starts in content, and a grammar applies from the first token."""
        for token in reversed(prompt_tokens):
            if token == self.start_marker:
                return False
            if token == self.end_marker:
                return True
        return False

    def count_reasoning_tokens(self, token_texts: Sequence[str], specials: Collection[str]) -> int:
        """``usage.completion_tokens_details.reasoning_tokens``: ``token_texts`` are the
        generated tokens decoded one by one (markers as themselves), ``specials`` the
        tokenizer's special tokens. vLLM's BaseThinkingReasoningParser: tokens inside
        start/end markers, by depth."""
        count = depth = 0
        for token in token_texts:
            if token == self.start_marker:
                depth += 1
            elif token == self.end_marker:
                depth = max(depth - 1, 0)
            elif depth:
                count += 1
        return count


class ToolParser(ABC):
    """Extracts tool calls from model output (after reasoning was split off).

    One instance per generated sequence, fed like ``ReasoningParser``.
    """

    name: str
    # Whether vLLM turns skip_special_tokens off when tools are offered (tool_choice not
    # "none"), so that call markers the tokenizer marks special reach the parser.
    keeps_special_tokens: bool = False
    # Whether vLLM forces required / named calls with this model's own call format (a
    # structural tag, see ``structural_tag``) rather than its generic JSON list.
    native_required_and_named: bool = False
    # vLLM's ``engine_based_streaming``: see ReasoningParser.engine_based.
    engine_based: bool = False
    # vLLM's ``default_tool_strict_level`` (gateway.parsers.tool_constraints.STRICT_*): how
    # much of every request with tools a structural tag constrains; 0 is vLLM's "auto".
    default_tool_strict_level: int = 0
    # Whether this gateway reproduces vLLM's forced (required / named) calls for the parser;
    # where not, such a request is refused rather than answered differently.
    forced_calls_supported: bool = True

    @classmethod
    def for_request(cls, context: ParserContext) -> ToolParser:
        """A parser for one sequence of a request; the default ignores the context."""
        return cls()

    def structural_tag(
        self, tools: list[dict[str, Any]], tool_choice: str | dict[str, Any], single_call: bool
    ) -> dict[str, Any] | None:
        """The structural tag vLLM sends the engine for these ``tools`` (already narrowed and
        with ``strict`` resolved: see ``gateway.parsers.tool_constraints``); None when this
        model has none."""
        return None

    @abstractmethod
    def extract(self, text: str) -> ToolCallResult:
        """Extract the calls from a whole output (non-streaming)."""

    @abstractmethod
    def feed(self, delta_text: str) -> DeltaMessage | None:
        """Content and tool call pieces for the next text delta; ``None`` when nothing new."""

    def finish(self) -> DeltaMessage | None:
        """Flush text held back at the end of the stream."""
        return None
