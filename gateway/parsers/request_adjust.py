"""A chat request checked against the server's parsers and adjusted as vLLM 0.32's
``adjust_request`` does: ``skip_special_tokens`` off where the parsers read special tokens, the
tool-call grammar in ``structured_outputs``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from gateway.errors import GatewayError
from gateway.parsers.config import ParsingConfig, TokenizerVocab
from gateway.parsers.delegating import ChatParsing, ParsedRequest
from gateway.parsers.tool_constraints import named_tool, tool_structured_outputs


class AdjustableRequest(ParsedRequest, Protocol):
    """What the adjustment also reads and writes (``ChatCompletionRequest`` has it)."""

    skip_special_tokens: bool

    def output_constraint(self) -> dict[str, Any] | None:
        """The request's own constraint with vLLM's field names (response_format folded in)."""
        ...

    def replace_output_constraint(self, structured_outputs: dict[str, Any]) -> None:
        """Hold the output to ``structured_outputs`` (vLLM's names) instead of its own."""
        ...


def _unavailable(tool_choice: Any) -> str:
    if tool_choice == "auto":
        return (
            '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
        )
    return f"tool_choice={_described(tool_choice)} requires --tool-call-parser to be set"


def _described(tool_choice: Any) -> str:
    name = named_tool(tool_choice)
    return f'function "{name}"' if name is not None else f'"{tool_choice}"'


def plan_parsing(
    config: ParsingConfig,
    request: AdjustableRequest,
    prompt_tokens: Callable[[], Sequence[str]],
    vocab: TokenizerVocab,
) -> ChatParsing | None:
    """Check the request's tool fields against the server's parsers and adjust it as vLLM
    does; None when nothing is parsed (the output is plain content)."""
    choice = request.tool_choice
    if choice not in (None, "none") and not config.tools_active:
        raise GatewayError(_unavailable(choice), 400, "tool_choice")
    if not config.reasoning_parser and not config.tools_active:
        return None
    parsing = ChatParsing(config, request, prompt_tokens(), vocab)
    forced = choice == "required" or named_tool(choice) is not None
    configured = parsing.configured_tool_parser()
    if forced and configured is not None and not configured.forced_calls_supported:
        raise GatewayError(
            f"tool_choice={_described(choice)} is not supported with --tool-call-parser "
            f"{config.tool_call_parser} by this gateway (vLLM holds such calls to a grammar "
            'of its own for this model); use tool_choice "auto"',
            400,
            "tool_choice",
        )
    _adjust_request(parsing, request)
    return parsing


def _adjust_request(parsing: ChatParsing, request: AdjustableRequest) -> None:
    reasoning = parsing.new_reasoning_parser()
    tools = parsing.configured_tool_parser()
    offered = bool(request.tools) and request.tool_choice not in (None, "none")
    if (reasoning is not None and reasoning.keeps_special_tokens) or (
        tools is not None and tools.keeps_special_tokens and offered
    ):
        request.skip_special_tokens = False
    # gpt-oss frames even a request's own structured output (no tools offered) in its final
    # channel, as vLLM's harmony parser does.
    frames_output = hasattr(tools, "wrap_output_format")
    if tools is None or not (offered or frames_output):
        return
    constraint = tool_structured_outputs(
        tools,
        request.tools or [],
        request.tool_choice,
        request.parallel_tool_calls,
        request.output_constraint(),
    )
    if constraint is not None:
        request.replace_output_constraint(constraint)


def grammar_from_first_token(parsing: ChatParsing | None, request: AdjustableRequest) -> bool:
    """vLLM's ``reasoning_ended`` for the engine: a grammar applies from the first token when
    reasoning is hidden or the prompt already closed it; otherwise the engine's own reasoning
    parser holds it back until the thought ends."""
    if parsing is None or not parsing.has_reasoning:
        return False
    return not request.include_reasoning or parsing.prompt_ends_reasoning
