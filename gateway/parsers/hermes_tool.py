"""``--tool-call-parser hermes`` (also ``qwen3_json``): vLLM 0.32's ``Hermes2ProToolParser``.

Calls are ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``. Behaviour reproduced
(``vllm/tool_parsers/hermes_tool_parser.py``, auto tool choice):

- Non-streaming: every ``<tool_call>...</tool_call>`` body, and a last body left open, must be
  JSON with ``name`` and ``arguments``; if any is not, nothing is a call and the whole text is
  content (so a call cut off mid-JSON comes back as raw content). Arguments are re-serialised
  with ``json.dumps(..., ensure_ascii=False)``. Content is the text before the first tag, ``None``
  when empty; text after the calls is dropped.
- Streaming re-parses all text so far and sends what is new: content before the first tag
  (holding back a suffix that may start ``<tool_call>``), then for each call in order its name
  once (with a fresh id) when ``"name": "..."`` is complete, then the raw argument text as it
  grows. A call cut off still sends its name and partial arguments. Once a body is complete
  JSON, the ``}`` closing the outer object is cut off the argument text; with ``arguments``
  before ``name`` the streamed arguments therefore differ from the non-streamed ones (as in
  vLLM). A call whose last delta carried pieces but no arguments gets ``"{}"`` at the end.
"""

from __future__ import annotations

import json
import re
from typing import Any

from gateway.parsers.base import (
    DeltaMessage,
    DeltaToolCall,
    ToolCall,
    ToolCallResult,
    ToolParser,
    make_tool_call_id,
    partial_tag_overlap,
)
from gateway.parsers.tool_constraints import arguments_schema, json_schema_format, tool_function

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)
_NAME_RE = re.compile(r'"name"\s*:\s*"([^"]+)"')
_ARGS_RE = re.compile(r'"arguments"\s*:\s*')


def _to_call(body: str) -> ToolCall:
    """Raises (ValueError, KeyError, TypeError) where vLLM's pydantic/json step would fail."""
    call: Any = json.loads(body)
    name = call["name"]
    if not isinstance(name, str):
        raise TypeError("tool name is not a string")
    return ToolCall(name=name, arguments=json.dumps(call["arguments"], ensure_ascii=False))


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _call_bodies(text: str) -> list[tuple[str, bool]]:
    """(stripped JSON body, complete) per ``<tool_call>`` region of a partial output."""
    bodies: list[tuple[str, bool]] = []
    pos = 0
    while (start := text.find(TOOL_CALL_START, pos)) != -1:
        body_start = start + len(TOOL_CALL_START)
        end = text.find(TOOL_CALL_END, body_start)
        if end != -1:
            bodies.append((text[body_start:end].strip(), True))
            pos = end + len(TOOL_CALL_END)
            continue
        raw = text[body_start:]
        raw = raw[: len(raw) - partial_tag_overlap(raw, TOOL_CALL_END)].strip()
        # A body that parses is complete even before </tool_call> arrives.
        bodies.append((raw, bool(raw) and _is_json(raw)))
        break
    return bodies


def _streamed_args(body: str, complete: bool) -> str | None:
    match = _ARGS_RE.search(body)
    if match is None:
        return None
    raw = body[match.end() :]
    if complete:
        raw = raw.rstrip()
        if raw.endswith("}"):
            raw = raw[:-1].rstrip()
    return raw


def _call_tags(tool: dict[str, Any]) -> list[dict[str, Any]]:
    """A call to ``tool`` as xgrammar's builtin "hermes" template spells it: with and without
    the newlines around the JSON."""
    head = f'{{"name": "{tool_function(tool)["name"]}", "arguments": '
    content = json_schema_format(arguments_schema(tool))
    return [
        {"type": "tag", "begin": f"{TOOL_CALL_START}\n{head}", "content": content,
         "end": f"}}\n{TOOL_CALL_END}"},
        {"type": "tag", "begin": f"{TOOL_CALL_START}{head}", "content": content,
         "end": f"}}{TOOL_CALL_END}"},
    ]  # fmt: skip


def hermes_structural_tag(
    tools: list[dict[str, Any]], tool_choice: str | dict[str, Any], single_call: bool
) -> dict[str, Any]:
    tags = [tag for tool in tools for tag in _call_tags(tool)]
    if tool_choice == "auto":
        fmt = {"type": "triggered_tags", "triggers": [TOOL_CALL_START], "tags": tags,
               "at_least_one": False, "stop_after_first": single_call, "excludes": []}  # fmt: skip
    else:
        # A named tool is called once; "required" as many times as parallel_tool_calls allows.
        once = single_call or tool_choice != "required"
        fmt = {"type": "tags_with_separator", "tags": tags, "separator": "",
               "at_least_one": True, "stop_after_first": once}  # fmt: skip
    return {"type": "structural_tag", "format": fmt}


class HermesToolParser(ToolParser):
    name = "hermes"
    keeps_special_tokens = True
    native_required_and_named = True

    def __init__(self) -> None:
        self._text = ""
        self._sent_content = 0
        self._names: list[str] = []
        self._sent_args: list[str] = []
        self._last_had_calls = False

    def structural_tag(
        self, tools: list[dict[str, Any]], tool_choice: str | dict[str, Any], single_call: bool
    ) -> dict[str, Any] | None:
        return hermes_structural_tag(tools, tool_choice, single_call)

    def extract(self, text: str) -> ToolCallResult:
        if TOOL_CALL_START not in text:
            return ToolCallResult(False, [], text)
        try:
            calls = [_to_call(a or b) for a, b in _TOOL_CALL_RE.findall(text)]
        except (ValueError, KeyError, TypeError):
            return ToolCallResult(False, [], text, failed=True)
        content = text[: text.find(TOOL_CALL_START)]
        # vLLM's serving layer nulls whitespace-only content next to calls (the "\n\n" after
        # </think>, say).
        return ToolCallResult(True, calls, content if content.strip() else None)

    def feed(self, delta_text: str) -> DeltaMessage | None:
        self._text += delta_text
        content = self._new_content()
        pieces: list[DeltaToolCall] = []
        for index, (body, complete) in enumerate(_call_bodies(self._text)):
            if index == len(self._names):
                name_match = _NAME_RE.search(body)
                if name_match is None:
                    break  # calls go out in order: wait for this one's name
                self._names.append(name_match.group(1))
                self._sent_args.append("")
                pieces.append(self._first_piece(index))
            if (args := self._new_args(index, body, complete)) is not None:
                pieces.append(DeltaToolCall(index=index, arguments=args))
        self._last_had_calls = bool(pieces)
        if content or pieces:
            return DeltaMessage(content=content, tool_calls=pieces)
        return None

    def _first_piece(self, index: int) -> DeltaToolCall:
        return DeltaToolCall(
            index=index, id=make_tool_call_id(), type="function", name=self._names[index]
        )

    def _new_content(self) -> str | None:
        text = self._text
        if TOOL_CALL_START in text:
            end = text.index(TOOL_CALL_START)
        else:
            end = len(text) - partial_tag_overlap(text, TOOL_CALL_START)
        if end <= self._sent_content:
            return None
        content = text[self._sent_content : end]
        self._sent_content = end
        return content

    def _new_args(self, index: int, body: str, complete: bool) -> str | None:
        args = _streamed_args(body, complete)
        # Only growth is sent; vLLM never retracts argument text already streamed.
        if args is None or len(args) <= len(self._sent_args[index]):
            return None
        diff = args[len(self._sent_args[index]) :]
        self._sent_args[index] = args
        return diff

    def finish(self) -> DeltaMessage | None:
        # vLLM's finalize_generation: when the last delta carried call pieces and the last call
        # never got argument text, it is closed with "{}". Content held back as a possible
        # "<tool_call>" prefix is never sent (vLLM drops it too).
        if self._last_had_calls and self._sent_args and not self._sent_args[-1]:
            self._sent_args[-1] = "{}"
            return DeltaMessage(tool_calls=[DeltaToolCall(len(self._names) - 1, arguments="{}")])
        return None
