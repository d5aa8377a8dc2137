"""Engines served as vLLM's ``--tool-call-parser`` and ``--reasoning-parser``
(``adapters.py``, run by ``DelegatingParser``)."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.parsers.base import (
    DeltaMessage,
    ParserContext,
    ReasoningParser,
    ReasoningResult,
    ToolCallResult,
    ToolParser,
)
from gateway.parsers.marker_engine.engine import Engine
from gateway.parsers.marker_engine.grammar import State


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
