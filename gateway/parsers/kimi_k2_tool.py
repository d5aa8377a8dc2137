"""``--tool-call-parser kimi_k2`` and ``--reasoning-parser kimi_k2``: vLLM 0.32's Kimi K2 engine.

vLLM serves one grammar, ``KimiK2Parser`` in ``vllm/parser/kimi_k2.py``, as both parsers
(``KimiK2ToolParser`` in ``vllm/tool_parsers/kimi_k2_tool_parser.py`` and
``KimiK2ReasoningParser`` in ``vllm/reasoning/kimi_k2_reasoning_parser.py``, the engine's
adapters; here this module holds the grammar, the engine and the tool parser, and
``kimi_k2_reasoning`` the reasoning parser). The output reads::

    <think>reasoning</think>text<|tool_calls_section_begin|>
    <|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Tokyo"}
    <|tool_call_end|><|tool_calls_section_end|>

All markers are special tokens. The header before ``<|tool_call_argument_begin|>`` is Kimi's own
tool call id (``functions.get_weather:0``), sent as the call's id; the name is the part before
``:N`` without ``functions.``. As in vLLM, a call whose header lacks ``:N`` is dropped, except
one cut off in its header, which is sent with the header as its name and a ``chatcmpl-tool-``
id. Arguments are the raw JSON text (whole outputs strip it and coerce values to the request's
tool schemas). Text inside the tool section but outside calls, and everything after it, is
dropped. Reasoning is open from the start unless thinking is off;
``<|tool_calls_section_begin|>`` also ends it.

Request inputs (keyword arguments, defaults as vLLM's): ``thinking`` / ``enable_thinking`` from
``chat_template_kwargs`` (thinking is on unless one of them is given and both are falsy),
``tools`` (the request's OpenAI tools, for argument types), ``special_tokens`` (the tokenizer's
special tokens, which vLLM drops from the text) and, for the tool parser,
``after_reasoning_parser`` (whether a reasoning parser runs first; see ``marker_engine``).
``kimi_k2_reasoning.KimiK2ReasoningParser.for_request`` reads the thinking flags from
``chat_template_kwargs``.

Forced and strict calls: vLLM's tool parser class names xgrammar's builtin "kimi" structural tag
(``get_kimi_structural_tag``, asked without its reasoning part), which ``kimi_structural_tag``
builds; required and named calls are then read by this parser.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from gateway.parsers.base import DeltaToolCall, ParserContext
from gateway.parsers.marker_engine.adapters import (
    EngineToolParser,
    suppresses_calls,
)
from gateway.parsers.marker_engine.engine import Engine
from gateway.parsers.marker_engine.grammar import Ev, Event, Grammar, State
from gateway.parsers.tool_constraints import (
    ToolChoice,
    arguments_schema,
    const_string_format,
    json_schema_format,
    sequence_format,
    structural_tag,
    tag_format,
    tags_with_separator_format,
    tool_function,
    triggered_tags_format,
)

THINK_START = "<think>"
THINK_END = "</think>"
TOOL_SECTION_START = "<|tool_calls_section_begin|>"
TOOL_SECTION_END = "<|tool_calls_section_end|>"
TOOL_CALL_START = "<|tool_call_begin|>"
TOOL_CALL_END = "<|tool_call_end|>"
TOOL_ARG_START = "<|tool_call_argument_begin|>"
MARKERS = (
    THINK_START,
    THINK_END,
    TOOL_SECTION_START,
    TOOL_SECTION_END,
    TOOL_CALL_START,
    TOOL_CALL_END,
    TOOL_ARG_START,
)

_TOOL_ID_RE = re.compile(r"(?P<id>.+:\d+)")


@functools.cache
def kimi_k2_grammar(thinking: bool = True) -> Grammar:
    """vLLM's ``kimi_k2_config``."""
    think = {"THINK_START": THINK_START, "THINK_END": THINK_END} if thinking else {}
    terminals = {
        **think,
        "TOOL_SECTION_START": TOOL_SECTION_START,
        "TOOL_SECTION_END": TOOL_SECTION_END,
        "TOOL_START": TOOL_CALL_START,
        "TOOL_END": TOOL_CALL_END,
        "ARG_START": TOOL_ARG_START,
    }
    reasoning = State.REASONING
    think_transitions = (
        {
            (reasoning, "THINK_START"): (reasoning, ()),
            (reasoning, "THINK_END"): (State.CONTENT, (Ev.REASONING_END,)),
            (State.CONTENT, "THINK_END"): (State.CONTENT, ()),
        }
        if thinking
        else {}
    )
    return Grammar(
        terminals=terminals,
        token_terminals=terminals,
        transitions={
            **think_transitions,
            (reasoning, "TOOL_SECTION_START"): (State.TOOL_PREAMBLE, (Ev.REASONING_END,)),
            (State.CONTENT, "TOOL_SECTION_START"): (State.TOOL_PREAMBLE, ()),
            (State.TOOL_PREAMBLE, "TOOL_START"): (State.TOOL_NAME, (Ev.TOOL_START,)),
            (State.TOOL_NAME, "ARG_START"): (State.TOOL_ARGS, ()),
            (State.TOOL_ARGS, "TOOL_END"): (State.TOOL_BETWEEN, (Ev.TOOL_END,)),
            (State.TOOL_ARGS, "TOOL_SECTION_END"): (State.TOOL_PREAMBLE, (Ev.TOOL_END,)),
            (State.TOOL_BETWEEN, "TOOL_START"): (State.TOOL_NAME, (Ev.TOOL_START,)),
            # The section never closes back to content: text after the calls is dropped.
            (State.TOOL_PREAMBLE, "TOOL_SECTION_END"): (State.TOOL_PREAMBLE, ()),
            (State.TOOL_BETWEEN, "TOOL_SECTION_END"): (State.TOOL_PREAMBLE, ()),
        },
        initial_state=reasoning if thinking else State.CONTENT,
        wait_for_reasoning=thinking,
        strip_content_whitespace_with_tools=False,
    )


def thinking_enabled(thinking: bool | None, enable_thinking: bool | None) -> bool:
    """vLLM's reading of the two chat_template_kwargs: on unless given and both falsy."""
    if thinking is None and enable_thinking is None:
        return True
    return bool(thinking) or bool(enable_thinking)


def _tool_id_and_name(header: str | None) -> tuple[str | None, str | None]:
    match = _TOOL_ID_RE.match(header.strip()) if header is not None else None
    if match is None:
        return None, None
    tool_id = match.group("id").strip()
    return tool_id, tool_id.split(":")[0].removeprefix("functions.")


class KimiK2Engine(Engine):
    """The engine with ``KimiK2Parser``'s hooks: ids and names from the call header."""

    def __init__(
        self,
        *,
        thinking: bool,
        tools: Sequence[Mapping[str, Any]] | None = None,
        special_tokens: Collection[str] = (),
    ) -> None:
        self.thinking = thinking
        super().__init__(kimi_k2_grammar(thinking), tools=tools, special_tokens=special_tokens)

    def emit_name(self, index: int, calls: list[DeltaToolCall], name: str | None) -> None:
        tool_id, tool_name = _tool_id_and_name(name)
        if not tool_name:
            if 0 <= index < len(self.slots):
                self.slots[index].name = ""
            return
        self.slots[index].id = tool_id or ""
        super().emit_name(index, calls, tool_name)

    def handle_tool_end(self, event: Event, calls: list[DeltaToolCall]) -> None:
        index = event.index
        if 0 <= index < len(self.slots) and not self.slots[index].name_sent:
            tool_id, tool_name = _tool_id_and_name(self.slots[index].name)
            if tool_name:
                self.slots[index].id = tool_id or ""
                self.slots[index].name = tool_name
        super().handle_tool_end(event, calls)

    def handle_args(self, event: Event, calls: list[DeltaToolCall]) -> None:
        index = event.index
        in_range = 0 <= index < len(self.slots)
        name_sent_before = in_range and self.slots[index].name_sent
        super().handle_args(event, calls)
        # The chunk that sends the name is argument text too (the base engine drops it).
        if event.value and not name_sent_before and in_range and self.slots[index].name_sent:
            calls.append(DeltaToolCall(index, arguments=event.value))

    def extract_args_json(self, raw_args: str, name: str) -> str:
        return raw_args.strip() or "{}"

    def extract_reasoning(self, text: str) -> tuple[str | None, str | None]:
        if not self.thinking:
            return None, text
        return super().extract_reasoning(text)


def _call_tag(tool: dict[str, Any]) -> dict[str, Any]:
    # The name goes in as it is (xgrammar does not escape it); the call index is any digits.
    content = sequence_format(
        {"type": "regex", "pattern": r"\d+"},
        const_string_format(TOOL_ARG_START),
        json_schema_format(arguments_schema(tool)),
    )
    begin = f"{TOOL_CALL_START}functions.{tool_function(tool)['name']}:"
    return tag_format(begin, content, TOOL_CALL_END)


def kimi_structural_tag(
    tools: list[dict[str, Any]], tool_choice: ToolChoice, single_call: bool
) -> dict[str, Any]:
    """xgrammar's "kimi" tag (no reasoning part) for ``tools`` as ``tag_tools`` chose them."""
    if tool_choice not in ("auto", "required"):
        # A named tool: one section holding that one call.
        calls = _call_tag(tools[0])
    else:
        calls = tags_with_separator_format(
            [_call_tag(tool) for tool in tools], at_least_one=True, stop_after_first=single_call
        )
    if tool_choice != "auto":
        section = [const_string_format(TOOL_SECTION_START), calls]
        return structural_tag(sequence_format(*section, const_string_format(TOOL_SECTION_END)))
    # Text, with a tool section wherever its marker appears.
    return structural_tag(
        triggered_tags_format(
            [TOOL_SECTION_START],
            [tag_format(TOOL_SECTION_START, calls, TOOL_SECTION_END)],
            stop_after_first=single_call,
            excludes=[THINK_START, THINK_END, TOOL_CALL_START],
        )
    )


class KimiK2ToolParser(EngineToolParser):
    name = "kimi_k2"
    native_required_and_named = True

    def __init__(
        self,
        *,
        thinking: bool | None = None,
        enable_thinking: bool | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        special_tokens: Collection[str] = (),
        after_reasoning_parser: bool = False,
        suppress_calls: bool = False,
    ) -> None:
        engine = KimiK2Engine(
            thinking=thinking_enabled(thinking, enable_thinking),
            tools=tools,
            special_tokens=special_tokens,
        )
        super().__init__(
            engine, after_reasoning_parser=after_reasoning_parser, suppress_calls=suppress_calls
        )

    @classmethod
    def for_request(cls, context: ParserContext) -> KimiK2ToolParser:
        kwargs = context.chat_template_kwargs
        return cls(
            thinking=kwargs.get("thinking"),
            enable_thinking=kwargs.get("enable_thinking"),
            tools=context.tools,
            special_tokens=context.special_tokens,
            after_reasoning_parser=context.reasoning_parser is not None,
            suppress_calls=suppresses_calls(context),
        )

    def structural_tag(
        self, tools: list[dict[str, Any]], tool_choice: ToolChoice, single_call: bool
    ) -> dict[str, Any] | None:
        return kimi_structural_tag(tools, tool_choice, single_call)
