"""``--reasoning-parser kimi_k2``: vLLM 0.32's Kimi K2 engine served as a reasoning parser
(``KimiK2ReasoningParser`` in ``vllm/reasoning/kimi_k2_reasoning_parser.py``).

The grammar and engine, shared with ``--tool-call-parser kimi_k2``, are in ``kimi_k2_tool``, whose
docstring describes the format; ``for_request`` reads the thinking flags from
``chat_template_kwargs``.
"""

from __future__ import annotations

from collections.abc import Collection

from gateway.parsers.base import ParserContext
from gateway.parsers.kimi_k2_tool import KimiK2Engine, thinking_enabled
from gateway.parsers.marker_engine.adapters import EngineReasoningParser


class KimiK2ReasoningParser(EngineReasoningParser):
    name = "kimi_k2"

    def __init__(
        self,
        *,
        thinking: bool | None = None,
        enable_thinking: bool | None = None,
        special_tokens: Collection[str] = (),
    ) -> None:
        engine = KimiK2Engine(
            thinking=thinking_enabled(thinking, enable_thinking), special_tokens=special_tokens
        )
        super().__init__(engine)

    @classmethod
    def for_request(cls, context: ParserContext) -> KimiK2ReasoningParser:
        kwargs = context.chat_template_kwargs
        return cls(
            thinking=kwargs.get("thinking"),
            enable_thinking=kwargs.get("enable_thinking"),
            special_tokens=context.special_tokens,
        )
