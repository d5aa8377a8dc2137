"""``--reasoning-parser glm45`` / ``glm47``: vLLM 0.32's GLM-4.7 engine served as a reasoning
parser (``Glm47MoeParserReasoningAdapter`` in ``vllm/reasoning/glm47_moe_reasoning_parser.py``).

The grammar and engine, shared with ``--tool-call-parser glm45``, are in ``glm45_tool``, whose
docstring describes the format and this parser's rules.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from gateway.parsers.base import ParserContext
from gateway.parsers.glm45_tool import (
    GLM_SPECIAL_TOKENS,
    THINK_END,
    THINK_START,
    TOOL_CALL_START,
    TURN_BOUNDARIES,
    Glm45Engine,
    thinking_from_kwargs,
)
from gateway.parsers.marker_engine.adapters import EngineReasoningParser


class Glm45ReasoningParser(EngineReasoningParser):
    name = "glm45"
    start_marker = THINK_START
    end_marker = THINK_END
    keeps_special_tokens = True  # vLLM's engine adapters always turn skipping off

    def __init__(
        self, *, thinking: bool = True, special_tokens: Collection[str] = GLM_SPECIAL_TOKENS
    ) -> None:
        self.thinking = thinking
        super().__init__(Glm45Engine(thinking=thinking, special_tokens=special_tokens))

    @classmethod
    def for_request(cls, context: ParserContext) -> Glm45ReasoningParser:
        return cls(
            thinking=thinking_from_kwargs(context.chat_template_kwargs),
            special_tokens=context.special_tokens or GLM_SPECIAL_TOKENS,
        )

    def prompt_ends_reasoning(self, prompt_tokens: Sequence[str]) -> bool:
        # ParserEngine.is_reasoning_end: </think> or a call ends reasoning, <think> opens it,
        # and the scan stops at the current turn's start.
        if not self.thinking:
            return True
        for token in reversed(prompt_tokens):
            if token in (THINK_END, TOOL_CALL_START):
                return True
            if token == THINK_START:
                return False
            if token in TURN_BOUNDARIES:
                break
        return False

    def count_reasoning_tokens(self, tokens: Sequence[str]) -> int:
        # Tokens the stream classifies as reasoning: up to the first end, without <think>.
        if not self.thinking:
            return 0
        count = 0
        for token in tokens:
            if token in (THINK_END, TOOL_CALL_START):
                break
            count += token != THINK_START
        return count
