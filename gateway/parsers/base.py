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
from dataclasses import dataclass, field

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
    """A whole output split into tool calls and the remaining content."""

    tools_called: bool
    tool_calls: list[ToolCall]
    content: str | None


class ReasoningParser(ABC):
    """Splits model output into reasoning and content.

    One instance per generated sequence: streaming state lives on the instance. Feed every text
    delta to ``feed`` in order, then call ``finish`` once when the sequence ends (it flushes any
    text held back while waiting to see whether a marker follows).
    """

    name: str

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


class ToolParser(ABC):
    """Extracts tool calls from model output (after reasoning was split off).

    One instance per generated sequence, fed like ``ReasoningParser``.
    """

    name: str

    @abstractmethod
    def extract(self, text: str) -> ToolCallResult:
        """Extract the calls from a whole output (non-streaming)."""

    @abstractmethod
    def feed(self, delta_text: str) -> DeltaMessage | None:
        """Content and tool call pieces for the next text delta; ``None`` when nothing new."""

    def finish(self) -> DeltaMessage | None:
        """Flush text held back at the end of the stream."""
        return None
