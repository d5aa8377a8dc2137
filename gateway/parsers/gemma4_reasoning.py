"""``--reasoning-parser gemma4``: vLLM 0.32's Gemma 4 engine served as a reasoning parser
(``Gemma4ParserReasoningAdapter`` in ``vllm/reasoning/gemma4_engine_reasoning_parser.py``).

The grammar and engine, shared with ``--tool-call-parser gemma4``, are in ``gemma4_tool``, whose
docstring describes the format; ``for_request`` reads ``enable_thinking`` from
``chat_template_kwargs``.
"""

from __future__ import annotations

from collections.abc import Collection

from gateway.parsers.base import ParserContext
from gateway.parsers.gemma4_tool import Gemma4Engine
from gateway.parsers.marker_engine.adapters import EngineReasoningParser


class Gemma4ReasoningParser(EngineReasoningParser):
    name = "gemma4"

    def __init__(self, *, enable_thinking: bool = False, special_tokens: Collection[str] = ()):
        super().__init__(Gemma4Engine(thinking=enable_thinking, special_tokens=special_tokens))

    @classmethod
    def for_request(cls, context: ParserContext) -> Gemma4ReasoningParser:
        thinking = bool(context.chat_template_kwargs.get("enable_thinking", False))
        return cls(enable_thinking=thinking, special_tokens=context.special_tokens)
