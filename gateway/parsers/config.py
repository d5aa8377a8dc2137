"""What the server's parsers were started with (vLLM's ``--reasoning-parser``,
``--tool-call-parser``, ``--enable-auto-tool-choice``) and what they need of the tokenizer."""

from __future__ import annotations

from dataclasses import dataclass, replace

from gateway.parsers.registry import (
    REASONING_PARSERS,
    TOOL_PARSERS,
    UnknownParserError,
    reasoning_parser,
    tool_parser,
)


@dataclass(frozen=True)
class ParsingConfig:
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    enable_auto_tool_choice: bool = False
    exclude_tools_when_tool_choice_none: bool = False

    def check(self) -> None:
        """Refuse at start what vLLM refuses: unknown names, auto tool choice without a parser."""
        if self.reasoning_parser and self.reasoning_parser not in REASONING_PARSERS:
            reasoning_parser(self.reasoning_parser)  # raises, listing the known names
        if self.tool_call_parser and self.tool_call_parser not in TOOL_PARSERS:
            tool_parser(self.tool_call_parser)
        if self.enable_auto_tool_choice and not self.tool_call_parser:
            raise UnknownParserError("--enable-auto-tool-choice requires --tool-call-parser")

    @property
    def tools_active(self) -> bool:
        # vLLM builds no tool parser at all without --enable-auto-tool-choice.
        return bool(self.enable_auto_tool_choice and self.tool_call_parser)

    def for_model(self, model_type: str | None) -> ParsingConfig:
        """vLLM's defaults for the model: gpt-oss output is harmony, read by openai_gptoss."""
        if model_type == "gpt_oss" and not self.reasoning_parser:
            return replace(self, reasoning_parser="openai_gptoss")
        return self


@dataclass(frozen=True)
class TokenizerVocab:
    """What parsers need of the tokenizer: its special tokens (vLLM drops them from parsed
    text) and its added tokens (some parsers pick their format by what the vocabulary has)."""

    special_tokens: frozenset[str] = frozenset()
    added_tokens: frozenset[str] = frozenset()
