"""vLLM 0.32's ``DelegatingParser``: a chat request's reasoning and tool calls, as its server
splits them.

``ChatParsing`` is one request's parsing (which parsers, how tool calls are read, what is shown;
``request_adjust.plan_parsing`` makes it) and makes one ``ChoiceParser`` per choice: reasoning
first, then tool calls on what follows it, for whole outputs and streamed deltas.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.parsers.base import (
    DeltaMessage,
    ParserContext,
    ReasoningParser,
    ToolCall,
    ToolParser,
)
from gateway.parsers.config import ParsingConfig, TokenizerVocab
from gateway.parsers.forced_calls import NamedCallParser, RequiredCallsParser
from gateway.parsers.gptoss_reasoning import GptOssReasoningParser
from gateway.parsers.registry import reasoning_parser, tool_parser
from gateway.parsers.tool_constraints import named_tool


class ParsedRequest(Protocol):
    """What the parsing reads of a chat request (the API's ``ChatCompletionRequest`` has it)."""

    @property
    def tools(self) -> list[dict[str, Any]] | None: ...

    @property
    def tool_choice(self) -> str | dict[str, Any] | None: ...

    @property
    def parallel_tool_calls(self) -> bool | None: ...

    @property
    def include_reasoning(self) -> bool: ...

    @property
    def chat_template_kwargs(self) -> dict[str, Any] | None: ...


@dataclass
class ParsedMessage:
    reasoning: str | None
    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)


def _reads_forced_json(parser: ToolParser) -> bool:
    """vLLM's ``supports_required_and_named``: whether vLLM reads a forced call (required /
    named) as its generic JSON rather than with the parser, as under "auto". Parsers with a
    native forced format, and the engine-based ones (vLLM marks those False too), read it
    with the parser."""
    return not (parser.native_required_and_named or parser.engine_based)


class ChatParsing:
    """One request's parsing: which parsers, how tool calls are read, what is shown."""

    def __init__(
        self,
        config: ParsingConfig,
        request: ParsedRequest,
        prompt_tokens: Sequence[str],
        vocab: TokenizerVocab,
    ) -> None:
        self.tool_choice = request.tool_choice
        self.parse_tools = config.tools_active and self.tool_choice not in (None, "none")
        self.include_reasoning = request.include_reasoning
        self.single_call = request.parallel_tool_calls is False
        self.named = named_tool(self.tool_choice) is not None
        self._reasoning_name = config.reasoning_parser
        self._tool_name = config.tool_call_parser if config.tools_active else None
        self.context = ParserContext(
            tools=request.tools,
            chat_template_kwargs=request.chat_template_kwargs or {},
            special_tokens=vocab.special_tokens,
            vocab=vocab.added_tokens,
            reasoning_parser=self._reasoning_name,
            tool_parser=self._tool_name,
            tool_choice=request.tool_choice,
        )
        probe = self.new_reasoning_parser()
        self.prompt_ends_reasoning = probe is None or probe.prompt_ends_reasoning(prompt_tokens)
        # gpt-oss: vLLM's HarmonyParser reads every token in one pass, whatever tool_choice
        # says (its stream carries calls under "none" too).
        self.harmony = isinstance(probe, GptOssReasoningParser)

    @property
    def has_reasoning(self) -> bool:
        return self._reasoning_name is not None

    def new_reasoning_parser(self) -> ReasoningParser | None:
        if self._reasoning_name is None:
            return None
        return reasoning_parser(self._reasoning_name, self.context)

    def configured_tool_parser(self) -> ToolParser | None:
        return tool_parser(self._tool_name, self.context) if self._tool_name else None

    def new_tool_parser(self) -> ToolParser | None:
        """The configured parser; for a call forced on a parser without a native format of its
        own, vLLM's generic JSON reader (the engine was held to that JSON)."""
        parser = self.configured_tool_parser()
        if parser is None or not self.parse_tools or not _reads_forced_json(parser):
            return parser
        if (name := named_tool(self.tool_choice)) is not None:
            return NamedCallParser(name)
        if self.tool_choice == "required":
            return RequiredCallsParser()
        return parser

    def choice(self) -> ChoiceParser:
        return ChoiceParser(self, self.new_reasoning_parser(), self.new_tool_parser())

    def message_content(self, content: str | None) -> str | None:
        """A whole reply's content: vLLM writes "" rather than null when a call was forced."""
        forced = self.named or self.tool_choice == "required"
        return (content or "") if forced and self.parse_tools else content

    def finish_reason(self, called: bool, engine_reason: str, streamed: bool) -> str:
        """vLLM's: "tool_calls" once calls were parsed (never for a named tool); a whole
        reply with ``required`` says it on a normal stop even without a call."""
        streams_calls = self.parse_tools or (streamed and self.harmony)
        if engine_reason != "stop" or not streams_calls or self.named:
            return engine_reason
        required = self.tool_choice == "required"
        if streamed:
            return "tool_calls" if called else engine_reason
        return "tool_calls" if required or called else engine_reason


class ChoiceParser:
    """vLLM's DelegatingParser for one sequence: ``whole`` for a final text, ``delta`` per
    streamed text delta."""

    def __init__(
        self, plan: ChatParsing, reasoning: ReasoningParser | None, tools: ToolParser | None
    ) -> None:
        self.plan, self.reasoning, self.tools = plan, reasoning, tools
        self._reasoning_ended = plan.prompt_ends_reasoning
        self.called = False  # whether any tool call piece was parsed
        self.call_count = 0  # calls sent (whole) or started (streamed)
        self.failed = False  # whether the whole reply had call markup the parser could not read
        # vLLM's _engine_based: both parsers run on its parser engine. Its tool parser then
        # also reads calls under tool_choice "none" (suppressed: the parser built from the
        # context's tool_choice drops the markup and reports none), and a reply without
        # calls keeps the tool parser's content (incomplete call markup left out).
        self.engine_based = (reasoning is None or reasoning.engine_based) and (
            tools is not None and tools.engine_based
        )
        # Harmony: the reasoning parser reads every delta (reasoning out, content and calls
        # on to the tool parser); vLLM streams the calls under any tool_choice.
        self._reads_every_delta = plan.harmony
        self._streams_calls = plan.parse_tools or (plan.harmony and tools is not None)

    def whole(self, text: str) -> ParsedMessage:
        reasoning, content = None, text
        if self.reasoning is not None:
            split = self.reasoning.extract(text)
            reasoning, content = split.reasoning, split.content
        calls: list[ToolCall] = []
        if self.tools is not None and self.plan.parse_tools:
            calls, content = self._whole_calls(content)
        elif self.tools is not None and self.engine_based:
            content = self.tools.extract(content or "").content
        if self.plan.single_call:
            calls = calls[:1]
        self.called, self.call_count = bool(calls), len(calls)
        if not self.plan.include_reasoning:
            reasoning = None
        return ParsedMessage(reasoning, content, calls)

    def _whole_calls(self, content: str | None) -> tuple[list[ToolCall], str | None]:
        assert self.tools is not None
        result = self.tools.extract(content if content is not None else "")
        self.failed = result.failed
        if result.tools_called:
            text = result.content
            return result.tool_calls, None if text is not None and not text.strip() else text
        forced = self.plan.named or self.plan.tool_choice == "required"
        if forced and (content is None or not content.strip()):
            return [], None
        if isinstance(self.tools, (NamedCallParser, RequiredCallsParser)):
            return [], None  # vLLM's generic JSON path keeps no content, call or not
        if self.engine_based:
            return [], result.content or None
        # The parser's content is vLLM's: the text itself when vLLM found no call, None
        # where vLLM's parser said "called" with no call to show (DeepSeek V3.1 cut off).
        return [], None if content is None else result.content

    def delta(self, text: str, finished: bool) -> DeltaMessage | None:
        message: DeltaMessage | None = None
        transitioned = False
        if self.reasoning is not None and (self._reads_every_delta or not self._reasoning_ended):
            message = self.reasoning.feed(text)
            if self.reasoning.reasoning_ended:
                self._reasoning_ended = transitioned = True
                text = (message.content if message else None) or ""
        if self._in_tool_phase:
            message = self._tool_delta(text, message)
        elif message is None and not transitioned and self._reasoning_ended:
            message = DeltaMessage(content=text) if text else None
        if finished:
            message = self._finish(message)
        return self._shown(message)

    @property
    def _in_tool_phase(self) -> bool:
        return self.tools is not None and self._reasoning_ended

    def _tool_delta(self, text: str, before: DeltaMessage | None) -> DeltaMessage | None:
        assert self.tools is not None
        if self._streams_calls:
            message = self.tools.feed(text) if text else None
        elif self.engine_based:
            message = self.tools.feed(text) if text else None
            if message is not None:
                message.tool_calls = []
        else:
            message = DeltaMessage(content=text) if text else None
        if before is not None and before.reasoning:
            message = message or DeltaMessage()
            message.reasoning = message.reasoning or before.reasoning
        return message

    def _finish(self, message: DeltaMessage | None) -> DeltaMessage | None:
        # Text a parser held back (a possible marker prefix, a call's closing "{}"): the
        # reasoning parser's only while still in reasoning, as vLLM flushes it.
        if self._reads_every_delta and self.reasoning is not None:
            message = _merge_optional(message, self._harmony_tail(self.reasoning))
        flushing: list[ReasoningParser | ToolParser] = []
        if self.reasoning is not None and not self._reasoning_ended:
            flushing.append(self.reasoning)
        reads_calls = self._streams_calls or self.engine_based
        if self.tools is not None and reads_calls and self._reasoning_ended:
            flushing.append(self.tools)
        for parser in flushing:
            if (flushed := parser.finish()) is not None:
                message = _merge(message, flushed)
        return message

    def _harmony_tail(self, reasoning: ReasoningParser) -> DeltaMessage | None:
        """What the harmony reasoning parser held back, on to the tool parser like a delta."""
        tail = reasoning.finish()
        if tail is None or self.tools is None:
            return tail
        return self._tool_delta(tail.content or "", tail)

    def reasoning_tokens(self, token_texts: Sequence[str], specials: Collection[str]) -> int:
        """``completion_tokens_details.reasoning_tokens`` for the generated tokens, each
        decoded alone (``specials``: the tokenizer's special tokens)."""
        counter = self.plan.new_reasoning_parser()
        if counter is None:
            return 0
        return counter.count_reasoning_tokens(token_texts, specials)

    def _shown(self, message: DeltaMessage | None) -> DeltaMessage | None:
        if message is None:
            return None
        if not self._streams_calls:
            message.tool_calls = []  # read only to keep call markup out of the content
        if message.tool_calls:
            self.called = True
            self.call_count += sum(c.id is not None for c in message.tool_calls)
            if self.plan.single_call:
                message.tool_calls = [c for c in message.tool_calls if c.index == 0]
        if not self.plan.include_reasoning:
            message.reasoning = None
            if not message.content and not message.tool_calls:
                return None
        return message


def _merge_optional(message: DeltaMessage | None, more: DeltaMessage | None) -> DeltaMessage | None:
    return message if more is None else _merge(message, more)


def _merge(message: DeltaMessage | None, more: DeltaMessage) -> DeltaMessage:
    if message is None:
        return more
    if more.content:
        message.content = (message.content or "") + more.content
    if more.reasoning:
        message.reasoning = (message.reasoning or "") + more.reasoning
    message.tool_calls = [*message.tool_calls, *more.tool_calls]
    return message
