"""``--reasoning-parser minimax_m2``: vLLM 0.32's ``MiniMaxM2ReasoningParser``.

vLLM's class (``vllm/reasoning/minimax_m2_reasoning_parser.py``) is the reasoning adapter of the
MiniMax M2 engine grammar, ``MinimaxM2Parser`` in ``vllm/parser/minimax_m2.py``. The output
reads::

    reasoning</think>text<minimax:tool_call><invoke name="get_weather">
    <parameter name="city">Seattle</parameter></invoke></minimax:tool_call>

The model writes no ``<think>``: output starts in reasoning (a ``<think>`` there is dropped)
until ``</think>``, or until ``<minimax:tool_call>``, which is then kept as content for the tool
parser. Trailing whitespace of the reasoning is dropped. In a whole output a later ``</think>``
is dropped from the content, and so is a ``</minimax:tool_call>`` outside a call; streamed,
only the delta that ends reasoning is read that way and later deltas pass through raw. The
``<think>``, ``</think>``, ``<minimax:tool_call>`` and ``</minimax:tool_call>`` markers are
single tokens.

``special_tokens`` (keyword): the tokenizer's special tokens, which vLLM drops from the text.
``minimax_m2_append_think`` is another vLLM class and is not this one.
"""

from __future__ import annotations

import functools
from collections.abc import Collection

from gateway.parsers.base import ParserContext
from gateway.parsers.marker_engine.adapters import EngineReasoningParser
from gateway.parsers.marker_engine.engine import Engine
from gateway.parsers.marker_engine.grammar import Ev, Grammar, State

THINK_START = "<think>"
THINK_END = "</think>"
TOOL_CALL_START = "<minimax:tool_call>"
TOOL_CALL_END = "</minimax:tool_call>"
MARKERS = (THINK_START, THINK_END, TOOL_CALL_START, TOOL_CALL_END)
_INVOKE_PREFIXES = ("INVOKE_PREFIX_DQ", "INVOKE_PREFIX_SQ", "INVOKE_PREFIX_UNQUOTED")
_NAME_ENDS = ("NAME_END_DQ", "NAME_END_SQ", "NAME_END_UNQUOTED")


@functools.cache
def minimax_m2_grammar() -> Grammar:
    """vLLM's ``minimax_m2_config``. The reasoning parser reads tool markup as content, but the
    tool terminals still shape it (what is held back while streaming, which closers vanish)."""
    content, reasoning, args = State.CONTENT, State.REASONING, State.TOOL_ARGS
    between = State.TOOL_BETWEEN
    invoke = {
        (state, terminal): (State.TOOL_NAME, (Ev.TOOL_START,))
        for state in (content, State.TOOL_PREAMBLE, between)
        for terminal in _INVOKE_PREFIXES
    }
    name_end = {(State.TOOL_NAME, terminal): (args, ()) for terminal in _NAME_ENDS}
    return Grammar(
        terminals={
            "THINK_START": THINK_START,
            "THINK_END": THINK_END,
            "TOOL_START": TOOL_CALL_START,
            "PARAM_START": "<parameter name=",
            "PARAM_END": "</parameter>",
            "TOOL_END": TOOL_CALL_END,
            "INVOKE_PREFIX_DQ": '<invoke name="',
            "INVOKE_PREFIX_SQ": "<invoke name='",
            "INVOKE_PREFIX_UNQUOTED": "<invoke name=",
            "INVOKE_END": "</invoke>",
            "NAME_END_DQ": '">',
            "NAME_END_SQ": "'>",
            "NAME_END_UNQUOTED": ">",
        },
        token_terminals={
            "THINK_START": THINK_START,
            "THINK_END": THINK_END,
            "TOOL_START": TOOL_CALL_START,
            "TOOL_END": TOOL_CALL_END,
        },
        transitions={
            (reasoning, "THINK_START"): (reasoning, ()),
            (reasoning, "THINK_END"): (content, (Ev.REASONING_END,)),
            (content, "THINK_END"): (content, ()),
            (reasoning, "TOOL_START"): (State.TOOL_PREAMBLE, (Ev.REASONING_END,)),
            (content, "TOOL_START"): (State.TOOL_PREAMBLE, ()),
            (args, "PARAM_START"): (args, (Ev.ARGS,)),
            (args, "PARAM_END"): (args, (Ev.ARGS,)),
            (State.TOOL_PREAMBLE, "TOOL_END"): (content, ()),
            (between, "TOOL_END"): (content, ()),
            (content, "TOOL_END"): (content, ()),
            (args, "INVOKE_END"): (between, (Ev.TOOL_END,)),
            **invoke,
            **name_end,
        },
        initial_state=reasoning,
        wait_for_reasoning=True,
        tool_args_json=False,
        validate_tool_names=True,
    )


class MiniMaxM2ReasoningParser(EngineReasoningParser):
    name = "minimax_m2"

    def __init__(self, *, special_tokens: Collection[str] = ()) -> None:
        super().__init__(Engine(minimax_m2_grammar(), special_tokens=special_tokens))

    @classmethod
    def for_request(cls, context: ParserContext) -> MiniMaxM2ReasoningParser:
        return cls(special_tokens=context.special_tokens)
