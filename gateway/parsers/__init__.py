"""Reasoning and tool-call parsers matching vLLM 0.32's OpenAI server, without vLLM.

Look a parser up by vLLM's name (``reasoning_parser("qwen3")``, ``tool_parser("hermes")``), one
instance per generated sequence; ``extract`` splits a whole output, ``feed``/``finish`` stream it.

Modules: ``<family>_tool`` / ``<family>_reasoning`` per model family (a grammar both of a family's
parsers run on lives in its ``_tool`` module; gpt-oss's harmony reader in ``gptoss_reasoning``,
whose content ``openai`` reads); ``marker_engine/`` the engine most families run on;
``delegating``, ``request_adjust`` and ``config`` a chat request's parsing as vLLM's server
runs it.
"""

from gateway.parsers.base import (
    DeltaMessage,
    DeltaToolCall,
    ParserContext,
    ReasoningParser,
    ReasoningResult,
    ToolCall,
    ToolCallResult,
    ToolParser,
    make_tool_call_id,
)
from gateway.parsers.registry import (
    REASONING_PARSERS,
    TOOL_PARSERS,
    UnknownParserError,
    reasoning_parser,
    tool_parser,
)

__all__ = [
    "REASONING_PARSERS",
    "TOOL_PARSERS",
    "DeltaMessage",
    "DeltaToolCall",
    "ParserContext",
    "ReasoningParser",
    "ReasoningResult",
    "ToolCall",
    "ToolCallResult",
    "ToolParser",
    "UnknownParserError",
    "make_tool_call_id",
    "reasoning_parser",
    "tool_parser",
]
