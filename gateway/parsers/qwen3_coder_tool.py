"""``--tool-call-parser qwen3_coder`` (also ``qwen3_xml``): vLLM 0.32's ``Qwen3EngineToolParser``.

``vllm/tool_parsers/qwen3_engine_tool_parser.py`` adapts the Qwen3 parser engine
(``vllm/parser/qwen3.py``, ``Qwen3Parser`` / ``qwen3_config``), whose grammar runs here on
``gateway.parsers.marker_engine``. Calls are Qwen3-Coder's XML::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

Behaviour (auto tool choice):

- Parameter values lose one leading and one trailing newline and are then typed by the tool's
  JSON schema (integer, number, boolean, object, array, null; strings stay as written; no
  schema: all strings). A ``<parameter=`` without ``</parameter>`` ends at the next one.
- ``<function=`` also opens a call without ``<tool_call>``; a ``<tool_call>`` may follow a
  ``</function>`` without ``</tool_call>``. Text inside ``<tool_call>`` outside a function is
  dropped, and so is all text after the first call in a whole output (streamed, text after
  call markup in one delta waits for a delta without call pieces). A call cut off keeps the
  parameters seen so far.
- Content next to calls is stripped, ``None`` when empty. The tokenizer's special tokens
  (``<|im_end|>``, ...) are removed.
- Streaming sends a call's name once its ``>`` arrives, then argument JSON as it becomes safe:
  up to the last parameter, whose value streams only while it can only stay a string.

Keywords: ``tools`` (the request's OpenAI tools: argument types), ``special_tokens`` (the
tokenizer's ``all_special_tokens``, which vLLM removes; default Qwen3's), and
``after_reasoning_parser`` (a reasoning parser runs first: vLLM then drops a stray ``</think>``
from the content, which it otherwise keeps as text).

Forced and strict calls: vLLM's class names xgrammar's builtin "qwen_3_coder" structural tag
(``get_qwen_3_5_structural_tag``), which ``qwen3_coder_structural_tag`` builds; required and
named calls are then read by this parser.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from gateway.parsers.base import ParserContext
from gateway.parsers.marker_engine.adapters import EngineToolParser, suppresses_calls
from gateway.parsers.marker_engine.engine import Engine
from gateway.parsers.marker_engine.grammar import Ev, Grammar, State
from gateway.parsers.tool_constraints import (
    ToolChoice,
    arguments_schema,
    json_schema_format,
    tag_format,
    tool_function,
    triggered_calls_tag,
)

# The ``regex`` module's ``\s`` (Unicode White_Space), which vLLM's patterns use; ``re``'s
# ``\s`` also matches \x1c-\x1f.
WS = r"[\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"

_PARAM_RE = re.compile(
    rf"<{WS}*parameter{WS}*={WS}*([^>]*)>"
    r"(.*?)"
    rf"(?:<{WS}*/{WS}*parameter{WS}*>|(?=<{WS}*parameter{WS}*=))",
    re.DOTALL,
)
_PARTIAL_PARAM_RE = re.compile(rf"<{WS}*parameter{WS}*={WS}*([^>]+)>(.*)$", re.DOTALL)


def _trim_wrapping_newlines(value: str) -> str:
    """One newline each side is the template's markup, not the value."""
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


def qwen3_arguments(raw_args: str, partial: bool) -> str:
    """The JSON object of a function body's ``<parameter=...>`` tags, values as strings
    (``_qwen3_arg_converter``); ``partial`` adds a last parameter still open."""
    params: dict[str, object] = {}
    for match in _PARAM_RE.finditer(raw_args):
        params[match.group(1)] = _trim_wrapping_newlines(match.group(2))
    if partial:
        open_param = _PARTIAL_PARAM_RE.search(_PARAM_RE.sub("", raw_args))
        if open_param and open_param.group(1):
            params[open_param.group(1)] = _trim_wrapping_newlines(open_param.group(2))
    return json.dumps(params, ensure_ascii=False)


C, R = State.CONTENT, State.REASONING
PRE, NAME, ARGS, BETWEEN = State.TOOL_PREAMBLE, State.TOOL_NAME, State.TOOL_ARGS, State.TOOL_BETWEEN

QWEN3_GRAMMAR = Grammar(
    terminals={
        "THINK_START": "<think>",
        "THINK_END": "</think>",
        "TOOL_START": "<tool_call>",
        "TOOL_END": "</tool_call>",
        "FUNC_PREFIX": "<function=",
        "FUNC_END": "</function>",
        "PARAM_START": "<parameter=",
        "PARAM_END": "</parameter>",
        "CLOSE_ANGLE": ">",
    },
    token_terminals={
        "THINK_START": "<think>",
        "THINK_END": "</think>",
        "TOOL_START": "<tool_call>",
        "TOOL_END": "</tool_call>",
    },
    transitions={
        (R, "THINK_START"): (R, ()),
        (R, "THINK_END"): (C, (Ev.REASONING_END,)),
        # A </think> after reasoning ended is dropped.
        (C, "THINK_END"): (C, ()),
        (R, "TOOL_START"): (PRE, (Ev.REASONING_END, Ev.TOOL_START)),
        (C, "TOOL_START"): (PRE, (Ev.REASONING_END, Ev.TOOL_START)),
        (C, "FUNC_PREFIX"): (NAME, (Ev.TOOL_START,)),
        (PRE, "TOOL_END"): (C, (Ev.TOOL_END,)),
        (PRE, "FUNC_PREFIX"): (NAME, ()),
        (NAME, "CLOSE_ANGLE"): (ARGS, ()),
        (NAME, "FUNC_END"): (BETWEEN, (Ev.TOOL_END,)),
        (ARGS, "FUNC_END"): (BETWEEN, (Ev.TOOL_END,)),
        # Parameter tags are kept in the argument text for the converter.
        (ARGS, "PARAM_START"): (ARGS, (Ev.ARGS,)),
        (ARGS, "PARAM_END"): (ARGS, (Ev.ARGS,)),
        (BETWEEN, "TOOL_END"): (C, ()),
        (BETWEEN, "TOOL_START"): (PRE, (Ev.TOOL_START,)),
        (BETWEEN, "FUNC_PREFIX"): (NAME, (Ev.TOOL_START,)),
    },
    initial_state=R,
    arg_converter=qwen3_arguments,
    tool_args_json=False,
    strip_trailing_reasoning_whitespace=False,
)


# Qwen3(-Coder)'s tokenizer: eos, pad and additional special tokens.
QWEN3_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)


_CALL_TRIGGER = "<tool_call>\n<function="


def _call_tag(tool: dict[str, Any]) -> dict[str, Any]:
    # xgrammar writes the name into the begin string as it is, unescaped; the arguments are
    # <parameter=...> elements ("qwen_xml" style).
    return tag_format(
        f"{_CALL_TRIGGER}{tool_function(tool)['name']}>\n",
        json_schema_format(arguments_schema(tool), style="qwen_xml"),
        "\n</function>\n</tool_call>",
    )


def qwen3_coder_structural_tag(
    tools: list[dict[str, Any]], tool_choice: ToolChoice, single_call: bool
) -> dict[str, Any]:
    """xgrammar's "qwen_3_coder" tag (no reasoning part) for ``tools`` as ``tag_tools`` chose
    them."""
    return triggered_calls_tag(_CALL_TRIGGER, _call_tag, tools, tool_choice, single_call)


class Qwen3CoderToolParser(EngineToolParser):
    name = "qwen3_coder"
    keeps_special_tokens = True  # vLLM's engine adapters always turn skipping off
    native_required_and_named = True

    def __init__(
        self,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        special_tokens: Collection[str] = QWEN3_SPECIAL_TOKENS,
        after_reasoning_parser: bool = False,
        suppress_calls: bool = False,
    ) -> None:
        engine = Engine(QWEN3_GRAMMAR, tools=tools, special_tokens=special_tokens)
        super().__init__(
            engine, after_reasoning_parser=after_reasoning_parser, suppress_calls=suppress_calls
        )

    @classmethod
    def for_request(cls, context: ParserContext) -> Qwen3CoderToolParser:
        return cls(
            tools=context.tools,
            special_tokens=context.special_tokens or QWEN3_SPECIAL_TOKENS,
            after_reasoning_parser=context.reasoning_parser is not None,
            suppress_calls=suppresses_calls(context),
        )

    def structural_tag(
        self, tools: list[dict[str, Any]], tool_choice: ToolChoice, single_call: bool
    ) -> dict[str, Any] | None:
        return qwen3_coder_structural_tag(tools, tool_choice, single_call)
