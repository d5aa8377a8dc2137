"""``--tool-call-parser glm45`` / ``glm47`` and ``--reasoning-parser glm45`` / ``glm47``.

vLLM 0.32's ``Glm47MoeModelToolParser`` (``vllm/tool_parsers/glm47_moe_tool_parser.py``) and
``Glm47MoeParserReasoningAdapter`` (``vllm/reasoning/glm47_moe_reasoning_parser.py``) both
adapt the GLM-4.7 parser engine (``vllm/parser/glm47_moe.py``, ``Glm47MoeParser`` /
``glm47_moe_config``), whose grammar runs here on ``gateway.parsers.marker_engine``.
GLM-4.5/4.6/4.7 write::

    <think>reasoning</think>answer<tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    </tool_call>

Reasoning (``Glm45ReasoningParser``, in ``glm45_reasoning``; this module holds the grammar and
engine both parsers run on):

- Output starts in reasoning (``<think>`` optional, and dropped inside reasoning);
  ``</think>`` ends it, and so does ``<tool_call>``, which stays in the content.
- Whole output: a later ``<think>`` in the content re-enters reasoning, a later ``</think>``
  is dropped; reasoning is right-stripped. Streamed, trailing reasoning whitespace waits for
  more reasoning and is lost when reasoning ends; later deltas are raw content.
- ``enable_thinking``/``thinking`` false (template kwargs): all content.

Tools (``Glm45ToolParser``):

- The name is the stripped text up to the first ``<arg_key>`` (or ``</tool_call>``); a call
  to a name the request does not offer is dropped. Values are kept verbatim (no newline
  trimming) and typed by the tool's JSON schema; keys are stripped.
- Text after the first call is dropped from a whole output (streamed, text after call markup
  in one delta waits for a delta without call pieces); content next to calls is stripped,
  ``None`` when empty. A call cut off keeps the arguments seen so far.

Keywords: ``thinking`` (the request's switch, see ``thinking_from_kwargs``), ``tools`` (the
request's OpenAI tools: argument types and known names), ``special_tokens`` (the tokenizer's
``all_special_tokens``, which vLLM removes; default GLM-4.5's) and, for the tool parser,
``after_reasoning_parser`` (a reasoning parser runs first: vLLM then reads ``<think>`` and
``</think>`` in the content as markup, and as text otherwise).

Forced and strict calls: vLLM's tool parser class names the "glm_4_7" structural tag, built by
vLLM's own registry (``vllm/tool_parsers/structural_tag_registry.py``,
``get_glm_4_7_structural_tag``; xgrammar's builtin when every tool is strict), which
``glm_structural_tag`` builds. Its default strict level is "function": every request with tools
gets a tag, ``auto`` included; a non-strict tool's tag pins its argument keys and value types
only. Required and named calls are then read by this parser.
"""

from __future__ import annotations

import functools
import json
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
    STRICT_FUNCTION,
    ToolChoice,
    any_text_format,
    arguments_schema,
    const_string_format,
    json_schema_format,
    or_format,
    sequence_format,
    structural_tag,
    tag_format,
    tags_with_separator_format,
    tool_function,
    triggered_tags_format,
)

THINK_START = "<think>"
THINK_END = "</think>"
TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
# The ``regex`` module's ``\s`` (Unicode White_Space), which vLLM's patterns use; ``re``'s
# ``\s`` also matches \x1c-\x1f.
WS = r"[\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"
# Special tokens that open a turn of a rendered GLM prompt: a prompt's reasoning markers
# before the last of them belong to earlier turns.
TURN_BOUNDARIES = frozenset(("<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"))
# GLM-4.5's tokenizer's special tokens (its markers are added tokens outside this list).
GLM_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "[MASK]",
    "[gMASK]",
    "[sMASK]",
    "<sop>",
    "<eop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    "<|begin_of_image|>",
    "<|end_of_image|>",
    "<|begin_of_video|>",
    "<|end_of_video|>",
    "<|begin_of_audio|>",
    "<|end_of_audio|>",
    "<|begin_of_transcription|>",
    "<|end_of_transcription|>",
)

_ARG_RE = re.compile(
    rf"<arg_key>(?P<key>.*?)</arg_key>{WS}*<arg_value>(?P<value>.*?)</arg_value>", re.DOTALL
)
_PARTIAL_ARG_RE = re.compile(
    rf"<arg_key>(?P<key>.*?)</arg_key>{WS}*<arg_value>(?P<value>.*)$", re.DOTALL
)


def glm_arguments(raw_args: str, partial: bool) -> str:
    """The JSON object of a call's key/value tags, values as strings (``_glm47_arg_converter``);
    ``partial`` adds a last value still open."""
    params: dict[str, object] = {}
    for match in _ARG_RE.finditer(raw_args):
        params[match.group("key").strip()] = match.group("value")
    if partial:
        open_arg = _PARTIAL_ARG_RE.search(_ARG_RE.sub("", raw_args))
        if open_arg and (key := open_arg.group("key").strip()):
            params[key] = open_arg.group("value")
    return json.dumps(params, ensure_ascii=False)


C, R, NAME, ARGS = State.CONTENT, State.REASONING, State.TOOL_NAME, State.TOOL_ARGS


@functools.cache
def glm_grammar(thinking: bool = True) -> Grammar:
    """``glm47_moe_config``: without thinking there are no reasoning markers at all."""
    reasoning_terminals = {"THINK_START": THINK_START, "THINK_END": THINK_END} if thinking else {}
    reasoning_transitions = (
        {
            (C, "THINK_START"): (R, (Ev.REASONING_START,)),
            (R, "THINK_END"): (C, (Ev.REASONING_END,)),
            (C, "THINK_END"): (C, ()),
        }
        if thinking
        else {}
    )
    # Argument tags are kept in the argument text for the converter.
    arg_tags = ("ARG_KEY_START", "ARG_KEY_END", "ARG_VALUE_START", "ARG_VALUE_END")
    return Grammar(
        terminals={
            **reasoning_terminals,
            "TOOL_START": TOOL_CALL_START,
            "TOOL_END": "</tool_call>",
            "ARG_KEY_START": "<arg_key>",
            "ARG_KEY_END": "</arg_key>",
            "ARG_VALUE_START": "<arg_value>",
            "ARG_VALUE_END": "</arg_value>",
        },
        token_terminals={
            **reasoning_terminals,
            "TOOL_START": TOOL_CALL_START,
            "TOOL_END": "</tool_call>",
        },
        transitions={
            **reasoning_transitions,
            (R, "THINK_START"): (R, ()),
            (R, "TOOL_START"): (NAME, (Ev.REASONING_END, Ev.TOOL_START)),
            (C, "TOOL_START"): (NAME, (Ev.TOOL_START,)),
            (NAME, "ARG_KEY_START"): (ARGS, (Ev.ARGS,)),
            (NAME, "TOOL_END"): (C, (Ev.TOOL_END,)),
            (ARGS, "TOOL_END"): (C, (Ev.TOOL_END,)),
            **{(ARGS, tag): (ARGS, (Ev.ARGS,)) for tag in arg_tags},
        },
        initial_state=R if thinking else C,
        arg_converter=glm_arguments,
        tool_args_json=False,
        validate_tool_names=True,
    )


def thinking_from_kwargs(chat_template_kwargs: Mapping[str, Any]) -> bool:
    """``Glm47MoeParser``: on unless ``thinking`` or ``enable_thinking`` is given and neither
    is true."""
    thinking = chat_template_kwargs.get("thinking")
    enable_thinking = chat_template_kwargs.get("enable_thinking")
    if thinking is None and enable_thinking is None:
        return True
    return bool(thinking) or bool(enable_thinking)


class Glm45Engine(Engine):
    """The engine with ``Glm47MoeParser``'s hooks: names are stripped."""

    def __init__(
        self,
        *,
        thinking: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        special_tokens: Collection[str] = GLM_SPECIAL_TOKENS,
    ) -> None:
        self.thinking = thinking
        super().__init__(glm_grammar(thinking), tools=tools, special_tokens=special_tokens)

    def emit_name(self, index: int, calls: list[DeltaToolCall], name: str | None) -> None:
        super().emit_name(index, calls, None if name is None else name.strip())

    def handle_tool_end(self, event: Event, calls: list[DeltaToolCall]) -> None:
        if 0 <= event.index < len(self.slots):
            self.slots[event.index].name = self.slots[event.index].name.strip()
        super().handle_tool_end(event, calls)

    def extract_reasoning(self, text: str) -> tuple[str | None, str | None]:
        if not self.thinking:
            return None, text
        return super().extract_reasoning(text)


# Markers no free text in a tag may hold (vLLM's ``_GLM_4_7_VALUE_EXCLUDES``); text around calls
# may hold "<tool_call>", which opens one.
_VALUE_EXCLUDES = [THINK_START, THINK_END, TOOL_CALL_START, TOOL_CALL_END,
                   "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"]  # fmt: skip
_TEXT_EXCLUDES = [m for m in _VALUE_EXCLUDES if m != TOOL_CALL_START]
# Schema keywords that make the arguments more than a plain map of properties.
_NOT_PLAIN = ("$ref", "allOf", "anyOf", "oneOf", "patternProperties")


def _value_format(prop: dict[str, Any]) -> dict[str, Any]:
    """An argument value as the template writes it: strings verbatim, other types as JSON."""
    if "enum" in prop:
        values = [
            const_string_format(v if isinstance(v, str) else json.dumps(v)) for v in prop["enum"]
        ]
        return values[0] if len(values) == 1 else or_format(values)
    prop_type = prop.get("type")
    if isinstance(prop_type, list):
        formats = [_value_format({"type": t}) for t in prop_type if t != "string"]
        if "string" in prop_type:
            formats.append(any_text_format(_VALUE_EXCLUDES))
        return formats[0] if len(formats) == 1 else or_format(formats)
    if prop_type in (None, "string"):
        return any_text_format(_VALUE_EXCLUDES)
    return json_schema_format({"type": prop_type})


def _plain_properties(params: dict[str, Any]) -> dict[str, Any] | None:
    properties = params.get("properties")
    if (
        not isinstance(properties, dict)
        or not properties
        or params.get("additionalProperties") is True
        or any(key in params for key in _NOT_PLAIN)
    ):
        return None
    return properties


def _call_tag(tool: dict[str, Any]) -> dict[str, Any]:
    """A strict tool's arguments follow its schema ("glm_xml" style); a non-strict one's only
    their keys and basic value types, any number of them in any order (vLLM's shallow tag)."""
    function = tool_function(tool)
    begin = f"{TOOL_CALL_START}{function['name']}"  # the name as it is, unescaped
    properties = None if function["strict"] else _plain_properties(function.get("parameters") or {})
    if properties is None:
        content = json_schema_format(arguments_schema(tool), style="glm_xml")
        return tag_format(begin, content, TOOL_CALL_END)
    pairs = [
        sequence_format(
            const_string_format(f"<arg_key>{key}</arg_key><arg_value>"),
            _value_format(prop),
            const_string_format("</arg_value>"),
        )
        for key, prop in properties.items()
    ]
    content = {"type": "star", "content": pairs[0] if len(pairs) == 1 else or_format(pairs)}
    return tag_format(begin, content, TOOL_CALL_END)


def glm_structural_tag(
    tools: list[dict[str, Any]], tool_choice: ToolChoice, single_call: bool
) -> dict[str, Any]:
    """The "glm_4_7" tag (no reasoning part) for ``tools`` as ``tag_tools`` chose them."""
    tags = [_call_tag(tool) for tool in tools]
    named = tool_choice not in ("auto", "required")
    if tool_choice == "auto" or all(tool_function(t)["strict"] for t in tools):
        # vLLM hands all-strict requests to xgrammar's builtin: its forced call is one bare tag,
        # its required calls triggered tags. For "auto" vLLM's own tag is the same.
        if named:
            return structural_tag(tags[0])
        return structural_tag(
            triggered_tags_format(
                [TOOL_CALL_START],
                tags,
                at_least_one=tool_choice == "required",
                stop_after_first=single_call,
                excludes=_TEXT_EXCLUDES,
            )
        )
    return structural_tag(
        tags_with_separator_format(tags, at_least_one=True, stop_after_first=single_call or named)
    )


class Glm45ToolParser(EngineToolParser):
    name = "glm45"
    keeps_special_tokens = True  # vLLM's engine adapters always turn skipping off
    native_required_and_named = True
    default_tool_strict_level = STRICT_FUNCTION

    def __init__(
        self,
        *,
        thinking: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        special_tokens: Collection[str] = GLM_SPECIAL_TOKENS,
        after_reasoning_parser: bool = False,
        suppress_calls: bool = False,
    ) -> None:
        engine = Glm45Engine(thinking=thinking, tools=tools, special_tokens=special_tokens)
        super().__init__(
            engine, after_reasoning_parser=after_reasoning_parser, suppress_calls=suppress_calls
        )

    @classmethod
    def for_request(cls, context: ParserContext) -> Glm45ToolParser:
        return cls(
            thinking=thinking_from_kwargs(context.chat_template_kwargs),
            tools=context.tools,
            special_tokens=context.special_tokens or GLM_SPECIAL_TOKENS,
            after_reasoning_parser=context.reasoning_parser is not None,
            suppress_calls=suppresses_calls(context),
        )

    def structural_tag(
        self, tools: list[dict[str, Any]], tool_choice: ToolChoice, single_call: bool
    ) -> dict[str, Any] | None:
        return glm_structural_tag(tools, tool_choice, single_call)
