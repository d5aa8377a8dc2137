"""``--tool-call-parser deepseek_v31``: vLLM 0.32's ``DeepSeekV31ToolParser``.

Calls read (``vllm/tool_parsers/deepseekv31_tool_parser.py``)::

    text<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}
    <｜tool▁call▁end｜><｜tool▁calls▁end｜>

(without the line break). Behaviour reproduced:

- Non-streaming: with ``<｜tool▁calls▁begin｜>`` in the text, every complete
  ``<｜tool▁call▁begin｜>name<｜tool▁sep｜>arguments<｜tool▁call▁end｜>`` on one line is a call,
  its arguments the raw text (not checked as JSON), and the content is the text before the
  section (``None`` when empty); everything after it is dropped, calls that did not match
  included. Without that marker the whole text is content.
- Streaming follows vLLM's state machine over the text so far and the count of each marker
  token in it: content until ``<｜tool▁calls▁begin｜>``; a call's name once its
  ``<｜tool▁sep｜>`` arrives (with a fresh id), then the argument text as it grows, up to a line
  break; the delta closing a call sends the text before its last ``"}`` plus ``"}``. Its quirks
  are kept: a call opened and closed within one delta is not sent, text after the section is
  content, and a marker cut across two deltas is plain text (vLLM counts marker tokens, and
  a marker token never straddles deltas, so here a marker counts when one delta holds it).
- At the end, when the last delta carried call pieces, the last call's arguments are completed
  to the last parsed text (vLLM's ``get_remaining_unstreamed_args``).

Forced and strict calls: vLLM's class names xgrammar's builtin "deepseek_v3_1" structural tag
(``get_deepseek_v3_1_structural_tag``, asked without its reasoning part), which
``deepseek_v31_structural_tag`` builds; required and named calls are then read by this parser.
"""

from __future__ import annotations

import re
from typing import Any

from gateway.parsers.base import (
    DeltaMessage,
    DeltaToolCall,
    ToolCall,
    ToolCallResult,
    ToolParser,
    make_tool_call_id,
)
from gateway.parsers.tool_constraints import (
    ToolChoice,
    arguments_schema,
    json_schema_format,
    structural_tag,
    tag_format,
    tags_with_separator_format,
    tool_function,
    triggered_tags_format,
)

TOOL_CALLS_START = "<｜tool▁calls▁begin｜>"
TOOL_CALLS_END = "<｜tool▁calls▁end｜>"
TOOL_CALL_START = "<｜tool▁call▁begin｜>"
TOOL_CALL_END = "<｜tool▁call▁end｜>"
TOOL_SEP = "<｜tool▁sep｜>"
MARKERS = (TOOL_CALLS_START, TOOL_CALLS_END, TOOL_CALL_START, TOOL_CALL_END, TOOL_SEP)

# No DOTALL, as in vLLM: a name or arguments spanning lines does not match.
_TOOL_CALL_RE = re.compile(
    f"{TOOL_CALL_START}(?P<function_name>.*?){TOOL_SEP}(?P<function_arguments>.*?){TOOL_CALL_END}"
)
_PORTION_RE = re.compile(f"(?P<function_name>.*){TOOL_SEP}(?P<function_arguments>.*)")
_COUNTED = (TOOL_CALLS_START, TOOL_CALL_START, TOOL_CALL_END)


def _call_tag(tool: dict[str, Any], begin: str = "", end: str = "") -> dict[str, Any]:
    # The name goes in as it is (xgrammar does not escape it).
    name = tool_function(tool)["name"]
    content = json_schema_format(arguments_schema(tool))
    return tag_format(f"{begin}{TOOL_CALL_START}{name}{TOOL_SEP}", content, f"{TOOL_CALL_END}{end}")


def deepseek_v31_structural_tag(
    tools: list[dict[str, Any]], tool_choice: ToolChoice, single_call: bool
) -> dict[str, Any]:
    """xgrammar's "deepseek_v3_1" tag (no reasoning part) for ``tools`` as ``tag_tools`` chose
    them."""
    if tool_choice not in ("auto", "required"):
        # A named tool: that one call inside the section markers, as one tag.
        return structural_tag(_call_tag(tools[0], TOOL_CALLS_START, TOOL_CALLS_END))
    calls = tags_with_separator_format(
        [_call_tag(tool) for tool in tools], at_least_one=True, stop_after_first=single_call
    )
    section = tag_format(TOOL_CALLS_START, calls, TOOL_CALLS_END)
    if tool_choice == "required":
        return structural_tag(section)
    # Text, with a tool section wherever its marker appears.
    return structural_tag(
        triggered_tags_format(
            [TOOL_CALLS_START],
            [section],
            stop_after_first=single_call,
            excludes=["<think>", "</think>"],
        )
    )


class DeepSeekV31ToolParser(ToolParser):
    name = "deepseek_v31"
    native_required_and_named = True

    def __init__(self) -> None:
        self._text = ""
        self._counts = dict.fromkeys(_COUNTED, 0)  # marker tokens seen so far
        self._tool_id = -1
        self._name_sent = False
        self._calls: list[dict[str, str]] = []  # last parsed name/arguments per call
        self._streamed_args: list[str] = []
        self._last_pieces: list[DeltaToolCall] = []

    def structural_tag(
        self, tools: list[dict[str, Any]], tool_choice: ToolChoice, single_call: bool
    ) -> dict[str, Any] | None:
        return deepseek_v31_structural_tag(tools, tool_choice, single_call)

    def extract(self, text: str) -> ToolCallResult:
        if TOOL_CALLS_START not in text:
            return ToolCallResult(False, [], text)
        calls = [ToolCall(name=n, arguments=a) for n, a in _TOOL_CALL_RE.findall(text)]
        content = text[: text.find(TOOL_CALLS_START)]
        # vLLM's serving layer nulls whitespace-only content next to calls.
        return ToolCallResult(bool(calls), calls, content if content.strip() else None)

    def feed(self, delta_text: str) -> DeltaMessage | None:
        previous = self._counts
        current = {m: n + delta_text.count(m) for m, n in previous.items()}
        self._counts = current
        self._text += delta_text
        try:
            msg = self._step(delta_text, previous, current)
        except IndexError:
            msg = None  # vLLM logs the error and sends nothing for this delta
        self._last_pieces = msg.tool_calls if msg is not None else []
        return msg

    def _step(
        self, delta_text: str, previous: dict[str, int], current: dict[str, int]
    ) -> DeltaMessage | None:
        """One call of vLLM's ``extract_tool_calls_streaming`` (its try block)."""
        if not current[TOOL_CALLS_START]:
            return DeltaMessage(content=delta_text)
        # vLLM tests len(delta_token_ids) > 1: more than the call-start token alone.
        several_tokens = delta_text != TOOL_CALL_START
        delta_text = delta_text.replace(TOOL_CALLS_START, "").replace(TOOL_CALLS_END, "")
        prev_start, prev_end = previous[TOOL_CALL_START], previous[TOOL_CALL_END]
        cur_start, cur_end = current[TOOL_CALL_START], current[TOOL_CALL_END]
        portion: str | None = None
        text_portion: str | None = None

        if cur_start == cur_end and prev_end == cur_end and TOOL_CALL_END not in delta_text:
            return DeltaMessage(content=delta_text)
        if TOOL_CALL_END in delta_text:
            # vLLM appends the delta to a text that already ends with it.
            full_text = self._text + delta_text
            portion = full_text.split(TOOL_CALL_START)[-1].split(TOOL_CALL_END)[0].rstrip()
            delta_text = delta_text.split(TOOL_CALL_END)[0].rstrip()
            text_portion = delta_text.split(TOOL_CALL_END)[-1].lstrip()

        if cur_start > cur_end and cur_start > prev_start:
            portion = self._text.split(TOOL_CALL_START)[-1] if several_tokens else None
            text_portion = None
            self._tool_id += 1
            self._name_sent = False
            self._streamed_args.append("")
        elif cur_start > cur_end and cur_start == prev_start:
            portion = self._text.split(TOOL_CALL_START)[-1]
            text_portion = None
        elif cur_start == cur_end and cur_end >= prev_end:
            if not self._calls:
                return None
            if self._calls[self._tool_id].get("arguments"):
                return self._close_call(delta_text)
        else:
            text = delta_text.replace(TOOL_CALL_START, "").replace(TOOL_CALL_END, "")
            return DeltaMessage(content=text)
        return self._update_call(delta_text, portion, text_portion)

    def _close_call(self, delta_text: str) -> DeltaMessage | None:
        if '"}' not in delta_text:
            return None
        diff = delta_text[: delta_text.rindex('"}')] + '"}'
        self._streamed_args[self._tool_id] += diff
        return DeltaMessage(tool_calls=[DeltaToolCall(self._tool_id, arguments=diff)])

    def _update_call(
        self, delta_text: str, portion: str | None, text_portion: str | None
    ) -> DeltaMessage | None:
        call: dict[str, str] = {}
        if portion:
            match = _PORTION_RE.match(portion)
            if match is None:
                return None
            call = {"name": match.group(1), "arguments": match.group(2)}
        if not self._name_sent:
            if not call.get("name"):
                return None
            self._name_sent = True
            piece = DeltaToolCall(self._tool_id, make_tool_call_id(), "function", call["name"])
            return DeltaMessage(tool_calls=[piece])
        if portion is None:
            return DeltaMessage(content=delta_text) if text_portion is not None else None
        if len(self._calls) <= self._tool_id:
            self._calls.append({})
        previous = self._calls[self._tool_id].get("arguments")
        current = call.get("arguments")
        msg = None
        if current and (not previous or (current.startswith(previous) and current != previous)):
            diff = current[len(previous or "") :]
            msg = DeltaMessage(tool_calls=[DeltaToolCall(self._tool_id, arguments=diff)])
            self._streamed_args[self._tool_id] = current
        if self._tool_id == len(self._calls) - 1:
            self._calls[self._tool_id] = call
        else:
            self._calls.append(call)
        return msg

    def finish(self) -> DeltaMessage | None:
        # vLLM's finalize_generation: when the last delta carried call pieces, the last one
        # gets what was parsed of the last call's arguments but not yet streamed.
        if not self._last_pieces or not self._calls:
            return None
        index = len(self._calls) - 1
        expected = self._calls[index].get("arguments", "{}")  # vLLM dumps a missing one: "{}"
        sent = self._streamed_args[index] if index < len(self._streamed_args) else ""
        if not expected.startswith(sent) or len(expected) == len(sent):
            return None
        piece = DeltaToolCall(self._last_pieces[-1].index, arguments=expected[len(sent) :])
        return DeltaMessage(tool_calls=[piece])
