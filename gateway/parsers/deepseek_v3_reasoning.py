"""``--reasoning-parser deepseek_v3``: vLLM 0.32's ``DeepSeekV3ReasoningParser``.

vLLM's class (``vllm/reasoning/deepseek_v3_reasoning_parser.py``) picks its parser per request
from ``chat_template_kwargs``: with ``thinking`` or ``enable_thinking`` true it is the
``deepseek_r1`` parser (``<think>reasoning</think>content``, see ``deepseek_r1_reasoning``);
otherwise (the default) it is vLLM's identity parser, and the whole output is content, markers
included.

Request input (keyword arguments): ``thinking`` / ``enable_thinking``, the request's
``chat_template_kwargs`` of those names; either one true turns thinking on (``for_request``
reads them from the request's ``chat_template_kwargs``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from gateway.parsers.base import DeltaMessage, ParserContext, ReasoningParser, ReasoningResult
from gateway.parsers.deepseek_r1_reasoning import DeepSeekR1ReasoningParser


class _IdentityReasoningParser(ReasoningParser):
    """vLLM's ``IdentityReasoningParser``: no reasoning, all content."""

    name = "identity"

    @property
    def reasoning_ended(self) -> bool:
        return True

    def prompt_ends_reasoning(self, prompt_tokens: Sequence[str]) -> bool:
        return True

    def extract(self, text: str) -> ReasoningResult:
        return ReasoningResult(None, text)

    def feed(self, delta_text: str) -> DeltaMessage | None:
        return DeltaMessage(content=delta_text) if delta_text else None


class DeepSeekV3ReasoningParser(ReasoningParser):
    name = "deepseek_v3"

    def __init__(self, *, thinking: bool | None = None, enable_thinking: bool | None = None):
        self._parser: ReasoningParser = (
            DeepSeekR1ReasoningParser()
            if bool(thinking) or bool(enable_thinking)
            else _IdentityReasoningParser()
        )

    @classmethod
    def for_request(cls, context: ParserContext) -> DeepSeekV3ReasoningParser:
        kwargs = context.chat_template_kwargs
        return cls(thinking=kwargs.get("thinking"), enable_thinking=kwargs.get("enable_thinking"))

    @property
    def reasoning_ended(self) -> bool:
        return self._parser.reasoning_ended

    def prompt_ends_reasoning(self, prompt_tokens: Sequence[str]) -> bool:
        return self._parser.prompt_ends_reasoning(prompt_tokens)

    def count_reasoning_tokens(self, token_texts: Sequence[str], specials: Collection[str]) -> int:
        return self._parser.count_reasoning_tokens(token_texts, specials)

    def extract(self, text: str) -> ReasoningResult:
        return self._parser.extract(text)

    def feed(self, delta_text: str) -> DeltaMessage | None:
        return self._parser.feed(delta_text)

    def finish(self) -> DeltaMessage | None:
        return self._parser.finish()
