"""Parsers by the names vLLM's ``--reasoning-parser`` / ``--tool-call-parser`` accept.

Each lookup returns a new instance: a parser holds one sequence's streaming state.
"""

from __future__ import annotations

from typing import TypeVar

from gateway.parsers.base import ParserContext, ReasoningParser, ToolParser
from gateway.parsers.deepseek_r1_reasoning import DeepSeekR1ReasoningParser
from gateway.parsers.deepseek_v3_reasoning import DeepSeekV3ReasoningParser
from gateway.parsers.deepseek_v31_tool import DeepSeekV31ToolParser
from gateway.parsers.gemma4_reasoning import Gemma4ReasoningParser
from gateway.parsers.gemma4_tool import Gemma4ToolParser
from gateway.parsers.glm45_reasoning import Glm45ReasoningParser
from gateway.parsers.glm45_tool import Glm45ToolParser
from gateway.parsers.gptoss_reasoning import GptOssReasoningParser
from gateway.parsers.gptoss_tool import GptOssToolParser
from gateway.parsers.hermes_tool import HermesToolParser
from gateway.parsers.kimi_k2_reasoning import KimiK2ReasoningParser
from gateway.parsers.kimi_k2_tool import KimiK2ToolParser
from gateway.parsers.llama3_json_tool import Llama3JsonToolParser
from gateway.parsers.minimax_m2_reasoning import MiniMaxM2ReasoningParser
from gateway.parsers.mistral_reasoning import MistralReasoningParser
from gateway.parsers.mistral_tool import MistralToolParser
from gateway.parsers.pythonic_tool import Llama4PythonicToolParser, PythonicToolParser
from gateway.parsers.qwen3_coder_tool import Qwen3CoderToolParser
from gateway.parsers.qwen3_reasoning import Qwen3ReasoningParser

REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    "deepseek_r1": DeepSeekR1ReasoningParser,
    "deepseek_v3": DeepSeekV3ReasoningParser,
    "gemma4": Gemma4ReasoningParser,
    "glm45": Glm45ReasoningParser,
    "glm47": Glm45ReasoningParser,  # vLLM: same file and class as glm45
    "kimi_k2": KimiK2ReasoningParser,
    "minimax_m2": MiniMaxM2ReasoningParser,
    "mistral": MistralReasoningParser,
    "openai_gptoss": GptOssReasoningParser,
    "qwen3": Qwen3ReasoningParser,
}
TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "deepseek_v31": DeepSeekV31ToolParser,
    "gemma4": Gemma4ToolParser,
    "glm45": Glm45ToolParser,
    "glm47": Glm45ToolParser,  # vLLM: same file and class as glm45
    "hermes": HermesToolParser,
    "kimi_k2": KimiK2ToolParser,
    "llama3_json": Llama3JsonToolParser,
    "llama4_json": Llama3JsonToolParser,  # vLLM: same file and class as llama3_json
    "llama4_pythonic": Llama4PythonicToolParser,
    # v11+ tokenizers; pre-v11 ones need mistral_tool.mistral_tool_parser(vocab).
    "mistral": MistralToolParser,
    "openai": GptOssToolParser,
    "pythonic": PythonicToolParser,
    "qwen3_coder": Qwen3CoderToolParser,
    # vLLM 0.32 aliases qwen3_json to the hermes parser (same file and class).
    "qwen3_json": HermesToolParser,
    "qwen3_xml": Qwen3CoderToolParser,  # vLLM: same file and class as qwen3_coder
}


T = TypeVar("T")


class UnknownParserError(ValueError):
    """A parser name that is not registered; the message lists the known names."""


def _lookup(kind: str, name: str, table: dict[str, type[T]]) -> type[T]:
    try:
        return table[name]
    except KeyError:
        known = ", ".join(sorted(table))
        raise UnknownParserError(f"unknown {kind} parser {name!r}; known: {known}") from None


def reasoning_parser(name: str, context: ParserContext | None = None) -> ReasoningParser:
    """A new reasoning parser registered as ``name`` (vLLM's ``--reasoning-parser`` value),
    built for a request's ``context`` (vLLM's defaults without one)."""
    cls = _lookup("reasoning", name, REASONING_PARSERS)
    return cls.for_request(context) if context is not None else cls()


def tool_parser(name: str, context: ParserContext | None = None) -> ToolParser:
    """A new tool parser registered as ``name`` (vLLM's ``--tool-call-parser`` value), built
    for a request's ``context`` (vLLM's defaults without one)."""
    cls = _lookup("tool call", name, TOOL_PARSERS)
    return cls.for_request(context) if context is not None else cls()
