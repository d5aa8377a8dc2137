"""``--tool-call-parser gemma4`` and ``--reasoning-parser gemma4``: vLLM 0.32's Gemma 4 engine.

vLLM serves one grammar, ``Gemma4Parser`` in ``vllm/parser/gemma4.py``, as both parsers
(``Gemma4EngineToolParser`` in ``vllm/tool_parsers/gemma4_engine_tool_parser.py`` and
``Gemma4ParserReasoningAdapter`` in ``vllm/reasoning/gemma4_engine_reasoning_parser.py``). The
output reads::

    <|channel>thought
    reasoning<channel|>text<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|>

``<|channel>``, ``<channel|>``, ``<|tool_call>`` and ``<tool_call|>`` are special tokens; ``<|"|>``
delimits strings. Arguments are Gemma's ``key:value`` syntax (nested ``{}`` / ``[]``, bare
numbers and booleans, ``(...)`` accepted for ``{...}``), turned into JSON whose values stay
strings unless the request's tool schema gives them another type. A call may open without
``call`` (``<|tool_call>:name{...}``); ``<|tool_call>`` also ends reasoning. Reasoning drops the
``thought\\n`` line that opens it. When the first text read (the whole output, or the first
delta) shows ``<channel|>`` or starts with ``thought\\n`` but has no ``<|channel>``, one is put
in front (the template opened the channel). ``vllm/tool_parsers/gemma4_utils.py`` holds
offline helpers the server does not use.

This module holds the grammar and engine both parsers run on, and the tool parser; the
reasoning parser is in ``gemma4_reasoning``.

Request inputs (keyword arguments, defaults as vLLM's): ``enable_thinking`` from
``chat_template_kwargs`` (default off; then vLLM streams the whole output as content, while a
whole output still has its channel split off as reasoning), ``tools`` (the request's OpenAI
tools, for argument types), ``special_tokens`` (the tokenizer's special tokens, which vLLM drops
from the text) and, for the tool parser, ``after_reasoning_parser`` (see ``marker_engine``).
``gemma4_reasoning.Gemma4ReasoningParser.for_request`` reads ``enable_thinking`` from
``chat_template_kwargs``.
A parser fed on its own takes the prompt not to end inside an open ``<|channel>`` (after a tool
response, say); vLLM would then start the output in reasoning even with thinking off.

Forced calls: vLLM's tool parser class reads required and named calls in Gemma's own syntax but
constrains none (no structural tag: xgrammar's Gemma 4 template is disabled, its ``<|"|>``
strings not being expressible), so such requests go out without a grammar.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from gateway.parsers.base import DeltaMessage, ParserContext
from gateway.parsers.marker_engine.adapters import (
    EngineToolParser,
    suppresses_calls,
)
from gateway.parsers.marker_engine.engine import Engine
from gateway.parsers.marker_engine.grammar import Ev, Event, Grammar, State

CHANNEL_START = "<|channel>"
CHANNEL_END = "<channel|>"
TOOL_CALL_START = "<|tool_call>"
TOOL_CALL_END = "<tool_call|>"
STRING_DELIM = '<|"|>'
MARKERS = (CHANNEL_START, CHANNEL_END, TOOL_CALL_START, TOOL_CALL_END, STRING_DELIM)
THOUGHT_PREFIX = "thought\n"

_DELIM_LEN = len(STRING_DELIM)
_PARTIAL_DELIM_SUFFIXES = tuple(STRING_DELIM[:k] for k in range(len(STRING_DELIM), 0, -1))


# ── Arguments (``_parse_gemma4_args`` and friends) ─────────────────────────────────────────


def _strip_partial_delim(value: str) -> str:
    for suffix in _PARTIAL_DELIM_SUFFIXES:
        if value.endswith(suffix):
            return value[: -len(suffix)]
    return value


def _skip_bracketed(text: str, i: int, open_ch: str, close_ch: str) -> tuple[int, bool]:
    """From just after ``open_ch`` at ``i``: (index after the matching ``close_ch``, closed);
    ``<|"|>`` strings are skipped whole."""
    depth, n = 1, len(text)
    while i < n and depth > 0:
        if text.startswith(STRING_DELIM, i):
            end = text.find(STRING_DELIM, i + _DELIM_LEN)
            i = n if end == -1 else end + _DELIM_LEN
            continue
        if text[i] == open_ch:
            depth += 1
        elif text[i] == close_ch:
            depth -= 1
        i += 1
    return i, depth == 0


def _nested(text: str, i: int) -> tuple[Any, int]:
    """The ``{...}`` or ``[...]`` value at ``i`` and the index after it (unclosed: partial)."""
    open_ch = text[i]
    close_ch, parse = ("}", parse_gemma4_args) if open_ch == "{" else ("]", _parse_gemma4_array)
    start = i + 1
    end, closed = _skip_bracketed(text, start, open_ch, close_ch)
    if closed:
        return parse(text[start : end - 1]), end
    return parse(text[start:end], partial=True), end


def _bare_value(text: str, i: int, stops: str, partial: bool) -> tuple[str | None, int, bool]:
    """(raw bare value or None, index after it, stop parsing). Streaming withholds a value that
    may still grow (at the end, or ending in ``.`` before more digits)."""
    start, n = i, len(text)
    while i < n and text[i] not in stops:
        i += 1
    if (partial and i >= n) or i == start:
        return None, i, True  # (vLLM logs "made no progress" for the second case)
    raw = text[start:i].strip()
    if partial and raw.endswith("."):
        return None, i, True
    return raw, i, False


def parse_gemma4_args(text: str, *, partial: bool = False) -> dict:
    """Gemma's ``key:value,...`` arguments as a dict (values are strings, dicts or lists)."""
    result: dict = {}
    if not text or not text.strip():
        return result
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in " ,\n\t":
            i += 1
        if i >= n:
            break
        colon = text.find(":", i)
        if colon == -1:
            break
        key = text[i:colon].strip()
        if key.startswith(STRING_DELIM) and key.endswith(STRING_DELIM):
            key = key[_DELIM_LEN:-_DELIM_LEN]
        i = colon + 1
        while i < n and text[i] in " \n\t":
            i += 1
        if i >= n:
            if not partial:
                result[key] = ""
            break
        if text.startswith(STRING_DELIM, i):
            i += _DELIM_LEN
            end = text.find(STRING_DELIM, i)
            if end == -1:
                value = text[i:]
                result[key] = _strip_partial_delim(value) if partial else value
                break
            result[key] = text[i:end]
            i = end + _DELIM_LEN
        elif text[i] in "{[":
            result[key], i = _nested(text, i)
        else:
            raw, i, stop = _bare_value(text, i, ",}]", partial)
            if stop:
                break
            result[key] = raw
    return result


def _parse_gemma4_array(text: str, *, partial: bool = False) -> list:
    items: list = []
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in " ,\n\t":
            i += 1
        if i >= n:
            break
        if text.startswith(STRING_DELIM, i):
            i += _DELIM_LEN
            end = text.find(STRING_DELIM, i)
            if end == -1:
                items.append(text[i:])
                break
            items.append(text[i:end])
            i = end + _DELIM_LEN
        elif text[i] in "{[":
            item, i = _nested(text, i)
            items.append(item)
        else:
            raw, i, stop = _bare_value(text, i, ",]", partial)
            if stop:
                break
            items.append(raw)
    return items


def gemma4_arg_converter(raw_args: str, partial: bool) -> str:
    """The argument text of a call (after its ``{``) as JSON."""
    text = raw_args.strip()
    # Operator precedence as in vLLM: a "}" always goes, a ")" only when unbalanced.
    if text.endswith("}") or text.endswith(")") and text.count("(") < text.count(")"):
        text = text[:-1]
    return json.dumps(parse_gemma4_args(text, partial=partial), ensure_ascii=False)


# ── Grammar and engine ──────────────────────────────────────────────────────────────────────


@functools.cache
def gemma4_grammar(thinking: bool = False) -> Grammar:
    """vLLM's ``gemma4_config``."""
    content, reasoning = State.CONTENT, State.REASONING
    call_start = (State.TOOL_PREAMBLE, (Ev.REASONING_END, Ev.TOOL_START))
    call_end = (content, (Ev.TOOL_END,))
    return Grammar(
        terminals={
            "THINK_START": CHANNEL_START,
            "THINK_END": CHANNEL_END,
            "TOOL_START": TOOL_CALL_START,
            "TOOL_END": TOOL_CALL_END,
            "CALL_PREFIX": "call:",
            "COLON": ":",
            "OPEN_BRACE": "{",
            "OPEN_PAREN": "(",
        },
        token_terminals={
            "THINK_START": CHANNEL_START,
            "THINK_END": CHANNEL_END,
            "TOOL_START": TOOL_CALL_START,
            "TOOL_END": TOOL_CALL_END,
        },
        transitions={
            (content, "THINK_START"): (reasoning, (Ev.REASONING_START,)),
            (reasoning, "THINK_START"): (reasoning, ()),
            (reasoning, "THINK_END"): (content, (Ev.REASONING_END,)),
            (reasoning, "TOOL_START"): call_start,
            (content, "TOOL_START"): call_start,
            (State.TOOL_PREAMBLE, "TOOL_END"): call_end,
            (State.TOOL_PREAMBLE, "CALL_PREFIX"): (State.TOOL_NAME, ()),
            (State.TOOL_PREAMBLE, "COLON"): (State.TOOL_NAME, ()),
            (State.TOOL_NAME, "OPEN_BRACE"): (State.TOOL_ARGS, ()),
            (State.TOOL_NAME, "OPEN_PAREN"): (State.TOOL_ARGS, ()),
            (State.TOOL_NAME, "TOOL_END"): call_end,
            (State.TOOL_ARGS, "TOOL_END"): call_end,
            # Stray closers after a call or a channel are swallowed.
            (content, "TOOL_END"): (content, ()),
            (content, "THINK_END"): (content, ()),
        },
        initial_state=content,
        wait_for_reasoning=thinking,
        arg_converter=gemma4_arg_converter,
        tool_args_json=False,
        arg_structural_chars=frozenset(",:{}[]<"),
        preserve_tokens=frozenset({STRING_DELIM}),
        turn_boundary_tokens=frozenset({"<|turn>", "<|tool_response>"}),
    )


class Gemma4Engine(Engine):
    """The engine with ``Gemma4Parser``'s hooks: the implied ``<|channel>`` and the
    ``thought\\n`` line."""

    def __init__(
        self,
        *,
        thinking: bool,
        tools: Sequence[Mapping[str, Any]] | None = None,
        special_tokens: Collection[str] = (),
    ) -> None:
        super().__init__(gemma4_grammar(thinking), tools=tools, special_tokens=special_tokens)

    def reset(self, initial_state: State | None = None) -> None:
        super().reset(initial_state)
        self._reasoning_text = ""
        self._prefix_stripped = False
        self._first_feed = True

    def preprocess(self, text: str) -> str:
        if not self._first_feed:
            return text
        self._first_feed = False
        if not text or self.machine.state != State.CONTENT or CHANNEL_START in text:
            return text
        if CHANNEL_END in text or text.startswith(THOUGHT_PREFIX) or text == "thought":
            return CHANNEL_START + text
        return text

    def to_delta(self, events: list[Event], finished: bool = False) -> DeltaMessage | None:
        delta = super().to_delta(events, finished)
        if delta is None or delta.reasoning is None or self._prefix_stripped:
            return delta
        return self._strip_thought_prefix(delta, finished)

    def _strip_thought_prefix(self, delta: DeltaMessage, finished: bool) -> DeltaMessage | None:
        """Streamed reasoning without its opening ``thought\\n``, held while it may be that."""
        reasoning = delta.reasoning or ""
        self._reasoning_text += reasoning
        prefix_len = len(THOUGHT_PREFIX)
        if self._reasoning_text.startswith(THOUGHT_PREFIX):
            before = len(self._reasoning_text) - len(reasoning)
            if before >= prefix_len:
                self._prefix_stripped = True
                return delta
            stripped = reasoning[prefix_len - before :]
            if stripped:
                self._prefix_stripped = True
                delta.reasoning = stripped
                return delta
            if len(self._reasoning_text) >= prefix_len:
                self._prefix_stripped = True
                delta.reasoning = None
                return delta if delta.content is not None or delta.tool_calls else None
            return None
        if THOUGHT_PREFIX.startswith(self._reasoning_text):
            # vLLM drops this delta whole, content and calls included.
            if finished:
                self._prefix_stripped = True
            return None
        self._prefix_stripped = True
        delta.reasoning = self._reasoning_text
        return delta

    def extract_reasoning(self, text: str) -> tuple[str | None, str | None]:
        reasoning, content = super().extract_reasoning(text)
        if reasoning:
            if reasoning.startswith(THOUGHT_PREFIX):
                reasoning = reasoning[len(THOUGHT_PREFIX) :]
            elif reasoning == THOUGHT_PREFIX.rstrip():
                reasoning = None
        return reasoning or None, content


class Gemma4ToolParser(EngineToolParser):
    name = "gemma4"
    # vLLM's supports_required_and_named = False: its own syntax, unconstrained (see above).
    native_required_and_named = True

    def __init__(
        self,
        *,
        enable_thinking: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
        special_tokens: Collection[str] = (),
        after_reasoning_parser: bool = False,
        suppress_calls: bool = False,
    ) -> None:
        engine = Gemma4Engine(thinking=enable_thinking, tools=tools, special_tokens=special_tokens)
        super().__init__(
            engine, after_reasoning_parser=after_reasoning_parser, suppress_calls=suppress_calls
        )

    @classmethod
    def for_request(cls, context: ParserContext) -> Gemma4ToolParser:
        return cls(
            enable_thinking=bool(context.chat_template_kwargs.get("enable_thinking", False)),
            tools=context.tools,
            special_tokens=context.special_tokens,
            after_reasoning_parser=context.reasoning_parser is not None,
            suppress_calls=suppresses_calls(context),
        )
