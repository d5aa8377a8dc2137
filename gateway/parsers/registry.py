"""Parsers by the names vLLM's ``--reasoning-parser`` / ``--tool-call-parser`` accept.

Each lookup returns a new instance: a parser holds one sequence's streaming state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from gateway.parsers.base import ReasoningParser, ToolParser
from gateway.parsers.deepseek_r1_reasoning import DeepSeekR1ReasoningParser
from gateway.parsers.hermes_tool import HermesToolParser
from gateway.parsers.qwen3_reasoning import Qwen3ReasoningParser

REASONING_PARSERS: dict[str, Callable[[], ReasoningParser]] = {
    "deepseek_r1": DeepSeekR1ReasoningParser,
    "qwen3": Qwen3ReasoningParser,
}
TOOL_PARSERS: dict[str, Callable[[], ToolParser]] = {
    "hermes": HermesToolParser,
    # vLLM 0.32 aliases qwen3_json to the hermes parser (same file and class).
    "qwen3_json": HermesToolParser,
}


T = TypeVar("T")


class UnknownParserError(ValueError):
    """A parser name that is not registered; the message lists the known names."""


def _lookup(kind: str, name: str, table: dict[str, Callable[[], T]]) -> T:
    try:
        factory = table[name]
    except KeyError:
        known = ", ".join(sorted(table))
        raise UnknownParserError(f"unknown {kind} parser {name!r}; known: {known}") from None
    return factory()


def reasoning_parser(name: str) -> ReasoningParser:
    """A new reasoning parser registered as ``name`` (vLLM's ``--reasoning-parser`` value)."""
    return _lookup("reasoning", name, REASONING_PARSERS)


def tool_parser(name: str) -> ToolParser:
    """A new tool parser registered as ``name`` (vLLM's ``--tool-call-parser`` value)."""
    return _lookup("tool call", name, TOOL_PARSERS)
