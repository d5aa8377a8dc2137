"""``--tool-call-parser llama3_json`` (also ``llama4_json``): vLLM 0.32's ``Llama3JsonToolParser``.

Calls are JSON objects ``{"name": ..., "parameters": {...}}`` (or ``"arguments"``), optionally
after ``<|python_tag|>``, several separated by ``"; "``. Behaviour reproduced
(``vllm/tool_parsers/llama_tool_parser.py``, auto tool choice):

- Non-streaming: every ``{`` not inside an object already read starts a JSON object
  (``raw_decode``); each must have ``name`` and ``arguments`` or ``parameters``. One that does
  not, or one that is not JSON, makes the whole text content with no calls. Text around the
  objects is dropped; arguments are re-serialised with ``json.dumps(..., ensure_ascii=False)``.
- Streaming reads JSON only when the text so far starts with ``<|python_tag|>`` or ``{``; any
  other text is content, delta by delta. It re-parses the text with ``partial_json_parser``
  (objects assumed ``"; "`` apart) and sends, one step per delta: a new call's start (nothing,
  or the rest of the previous call's arguments), then its name, then the growth of
  ``json.dumps(arguments)``, holding back what partial parsing may still change. At the end of
  the stream the last call's arguments are completed (vLLM's ``finalize_generation``).

The streamed behaviour depends on ``partial_json_parser``'s completions, hence that library
(vLLM's own) rather than a re-implementation.

Forced and strict calls: vLLM's class names xgrammar's builtin "llama" structural tag
(``get_llama_structural_tag``), which ``llama_structural_tag`` builds; required and named calls
are then read by this parser.
"""

from __future__ import annotations

import json
from typing import Any

import partial_json_parser
from partial_json_parser.core.options import Allow

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
    tag_format,
    tool_function,
    triggered_calls_tag,
)

BOT_TOKEN = "<|python_tag|>"
_CALL_SEPARATOR_LEN = len("; ")
_DECODER = json.JSONDecoder()


def _to_call(obj: Any) -> ToolCall:
    """Raises KeyError (and others) where vLLM's extraction gives up."""
    name = obj["name"]
    arguments = obj["arguments"] if "arguments" in obj else obj["parameters"]
    if not isinstance(name, str):
        raise TypeError("tool name is not a string")  # vLLM's pydantic model rejects it
    return ToolCall(name=name, arguments=json.dumps(arguments, ensure_ascii=False))


def _partial_loads(text: str, flags: Allow) -> tuple[Any, int]:
    """vLLM's ``partial_json_loads``: a partial object, or the first whole one and its end."""
    try:
        return partial_json_parser.loads(text, flags), len(text)
    except json.JSONDecodeError as e:
        if "Extra data" in e.msg:
            return _DECODER.raw_decode(text)
        raise


def _is_complete_json(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def _partial_calls(text: str, flags: Allow) -> tuple[list[Any], list[bool]]:
    """Every (partial) object in a streamed text and whether each is complete JSON."""
    calls: list[Any] = []
    complete: list[bool] = []
    start = len(BOT_TOKEN) if text.startswith(BOT_TOKEN) else 0
    while start < len(text):
        obj, end = _partial_loads(text[start:], flags)
        complete.append(_is_complete_json(text[start : start + end]))
        start += end + _CALL_SEPARATOR_LEN
        # vLLM runs these on whatever was parsed (a list, a number...): same errors here.
        if "parameters" in obj:
            if "arguments" in obj:
                raise ValueError("model generated both parameters and arguments")
            obj["arguments"] = obj["parameters"]
        calls.append(obj)
    return calls, complete


def _call_tag(tool: dict[str, Any]) -> dict[str, Any]:
    # xgrammar writes the name into the begin string as it is, unescaped.
    begin = f'{{"name": "{tool_function(tool)["name"]}", "parameters": '
    return tag_format(begin, json_schema_format(arguments_schema(tool)), "}")


def llama_structural_tag(
    tools: list[dict[str, Any]], tool_choice: ToolChoice, single_call: bool
) -> dict[str, Any]:
    """xgrammar's "llama" tag (no reasoning part) for ``tools`` as ``tag_tools`` chose them."""
    return triggered_calls_tag('{"name": ', _call_tag, tools, tool_choice, single_call)


class Llama3JsonToolParser(ToolParser):
    name = "llama3_json"
    native_required_and_named = True

    def __init__(self) -> None:
        self._text = ""
        self._prev_calls: list[Any] = []
        self._tool_id = -1
        self._name_sent = False
        self._streamed_args: list[str] = []
        self._last_call_index: int | None = None

    def structural_tag(
        self, tools: list[dict[str, Any]], tool_choice: ToolChoice, single_call: bool
    ) -> dict[str, Any] | None:
        return llama_structural_tag(tools, tool_choice, single_call)

    def extract(self, text: str) -> ToolCallResult:
        if BOT_TOKEN not in text and "{" not in text:
            return ToolCallResult(False, [], text)
        calls: list[ToolCall] = []
        end = -1
        start = text.find("{")
        while start != -1:
            # A brace inside (or right at the end of) the last object read is skipped.
            if start > end:
                try:
                    obj, length = _DECODER.raw_decode(text[start:])
                    end = start + length
                    calls.append(_to_call(obj))
                except Exception:
                    return ToolCallResult(False, [], text)
            start = text.find("{", start + 1)
        if calls:
            return ToolCallResult(True, calls, None)
        return ToolCallResult(False, [], text)

    def feed(self, delta_text: str) -> DeltaMessage | None:
        self._text += delta_text
        try:
            msg = self._step(delta_text)
        except Exception:
            # vLLM logs the error and skips the chunk; its state changes so far stay.
            msg = None
        self._last_call_index = msg.tool_calls[-1].index if msg and msg.tool_calls else None
        return msg

    def finish(self) -> DeltaMessage | None:
        # vLLM's finalize_generation: when the last delta carried call pieces, the arguments
        # parsed but not yet streamed for the last call are appended to it.
        if self._last_call_index is None:
            return None
        remaining = self._unstreamed_args()
        if not remaining:
            return None
        return DeltaMessage(tool_calls=[DeltaToolCall(self._last_call_index, arguments=remaining)])

    def _unstreamed_args(self) -> str:
        if not self._prev_calls:
            return ""
        index = len(self._prev_calls) - 1
        last = self._prev_calls[index]
        if not isinstance(last, dict):
            return ""  # vLLM raises here (a streamed non-object); sending nothing is saner
        args = last.get("arguments", {})
        expected = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        sent = self._streamed_args[index] if index < len(self._streamed_args) else ""
        return expected[len(sent) :] if expected.startswith(sent) else ""

    def _step(self, delta_text: str) -> DeltaMessage | None:
        if not (self._text.startswith(BOT_TOKEN) or self._text.startswith("{")):
            return DeltaMessage(content=delta_text)
        # Until the name is sent, partial strings are not parsed: names go out whole.
        flags = Allow.ALL if self._name_sent else Allow.ALL & ~Allow.STR
        calls, complete = _partial_calls(self._text, flags)
        if not calls:
            return None
        if len(calls) > self._tool_id + 1:
            return self._start_call(calls)
        if not self._name_sent:
            msg = self._name_piece(calls[self._tool_id])
        else:
            msg = self._args_piece(calls[self._tool_id], complete[self._tool_id])
        self._prev_calls = calls
        return msg

    def _start_call(self, calls: list[Any]) -> DeltaMessage | None:
        """A new object began: flush what the previous call's arguments still lacked."""
        msg = None
        if self._tool_id >= 0:
            args = calls[self._tool_id].get("arguments")
            if args:
                sent = len(self._streamed_args[self._tool_id])
                diff = json.dumps(args, ensure_ascii=False)[sent:]
                msg = DeltaMessage(tool_calls=[DeltaToolCall(self._tool_id, arguments=diff)])
                self._streamed_args[self._tool_id] += diff
        self._tool_id = len(calls) - 1
        self._name_sent = False
        self._streamed_args.append("")
        # As in vLLM, the parsed calls are not kept on this step.
        return msg

    def _name_piece(self, call: Any) -> DeltaMessage | None:
        name = call.get("name")
        if not name:
            return None
        if not isinstance(name, str):
            raise TypeError("tool name is not a string")  # vLLM's pydantic model rejects it
        self._name_sent = True
        first = DeltaToolCall(self._tool_id, id=make_tool_call_id(), type="function", name=name)
        return DeltaMessage(tool_calls=[first])

    def _args_piece(self, call: Any, complete: bool) -> DeltaMessage | None:
        args = call.get("arguments")
        if not args:
            return None
        sent = len(self._streamed_args[self._tool_id])
        args_json = json.dumps(args, ensure_ascii=False)
        prev_args = self._prev_calls[self._tool_id].get("arguments")
        diff = None
        if complete:
            diff = args_json[sent:]
        elif prev_args:
            prev_json = json.dumps(prev_args, ensure_ascii=False)
            if args_json != prev_json:
                # Only what two parses agree on is sure; the rest may be a completion artefact.
                diff = _common_prefix(prev_json, args_json)[sent:]
        if diff is None:
            return None
        self._streamed_args[self._tool_id] += diff
        return DeltaMessage(tool_calls=[DeltaToolCall(self._tool_id, arguments=diff)])
