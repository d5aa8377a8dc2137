"""``--tool-call-parser openai``: gpt-oss's tool calls, from the function-call messages that
``--reasoning-parser openai_gptoss`` (``gptoss_reasoning``, which describes the harmony format)
passes on in its content.

Grammars (``HarmonyParser.adjust_request`` and the "harmony" structural tag vLLM registers in
``vllm/parser/harmony.py``, not xgrammar's builtin of that name): a forced or strict call is a
call message in any of the header spellings harmony reads, after an optional analysis and an
optional commentary message (``harmony_structural_tag``); ``auto`` also allows a final message
instead. A request's own structured output is held to the final message
(``harmony_output_format``), even with no tools; ``parallel_tool_calls`` changes nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gateway.parsers.base import (
    DeltaMessage,
    DeltaToolCall,
    ToolCall,
    ToolCallResult,
    ToolParser,
    make_tool_call_id,
)
from gateway.parsers.gptoss_reasoning import (
    MESSAGE,
    START,
    HeaderError,
    Kind,
    first_message_end,
    kind_of,
    parse_header,
)
from gateway.parsers.tool_constraints import (
    ToolChoice,
    any_text_format,
    arguments_schema,
    const_string_format,
    json_schema_format,
    optional_format,
    or_format,
    sequence_format,
    structural_tag,
    tag_format,
    tool_function,
)


def _call_arguments(text: str, content_type: str | None) -> str:
    """Non-streamed arguments: JSON re-serialised unless the content type is not JSON."""
    if content_type is not None and "json" not in content_type:
        return text
    try:
        return json.dumps(json.loads(text))
    except ValueError:
        return text


@dataclass
class _Call:
    name: str
    content_type: str | None
    arguments: str = ""


class _CallReader:
    """Reads ``openai_gptoss``'s content: text, and messages from ``<|start|>`` to their end."""

    def __init__(self) -> None:
        self._header_text: str | None = None  # set from <|start|> to <|message|>
        self._kind: Kind | None = None  # set inside a message body
        self.calls: list[_Call] = []

    def feed(self, delta: str) -> list[tuple[str, str]]:
        """("content" | "open" | "arguments", text) pieces; "open" starts ``calls[-1]``."""
        out: list[tuple[str, str]] = []
        while delta:
            if self._header_text is not None:
                delta = self._read_header(delta, out)
            elif self._kind is not None:
                delta = self._read_body(delta, out)
            else:
                idx = delta.find(START)
                out.append(("content", delta if idx == -1 else delta[:idx]))
                if idx == -1:
                    break
                self._header_text = START
                delta = delta[idx + len(START) :]
        return [(what, text) for what, text in out if text or what == "open"]

    def finish(self) -> str:
        """Content held back: a header the output ended in (vLLM's recovered text)."""
        held, self._header_text, self._kind = self._header_text or "", None, None
        return held

    def _read_header(self, delta: str, out: list[tuple[str, str]]) -> str:
        assert self._header_text is not None
        idx = delta.find(MESSAGE)
        if idx == -1:
            self._header_text += delta
            return ""
        text, self._header_text = self._header_text + delta[:idx], None
        try:
            header = parse_header(text[len(START) :], None)
        except HeaderError:
            out.append(("content", text + MESSAGE))
        else:
            self._kind = kind_of(header)
            if self._kind is Kind.TOOL:
                name = (header.recipient or "").removeprefix("functions.")
                self.calls.append(_Call(name, header.content_type))
                out.append(("open", name))
        return delta[idx + len(MESSAGE) :]

    def _read_body(self, delta: str, out: list[tuple[str, str]]) -> str:
        end = first_message_end(delta)
        text = delta if end is None else delta[: end[0]]
        if self._kind is Kind.TOOL:
            self.calls[-1].arguments += text
            out.append(("arguments", text))
        elif self._kind is Kind.CONTENT:
            out.append(("content", text))
        if end is None:
            return ""
        self._kind = None
        return delta[end[0] + len(end[1]) :]


# A constrained message ends at <|end|> or at a stop token, written "" (xgrammar forbids stop
# tokens under a constraint).
_GRAMMAR_END = ["<|end|>", ""]
_JSON_CONSTRAINTS = (" json", " <|constrain|>json")
_CALL_CHANNELS = ("<|channel|>commentary", "<|channel|>analysis", "<|channel|>final")
# The recipient before or after the channel; the name goes in as it is, unescaped.
_CALL_HEADERS = (
    " to=functions.{name}{channel}{constraint}<|message|>",
    "{channel} to=functions.{name}{constraint}<|message|>",
)
_FINAL_HEADER = "<|channel|>final{constraint}<|message|>"


def _free_message(channel: str) -> dict[str, Any]:
    """An optional message of free text on ``channel``, then the next message's start."""
    message = tag_format(f"<|channel|>{channel}<|message|>", any_text_format(), "<|end|>")
    return optional_format(sequence_format(message, const_string_format("<|start|>assistant")))


def _after_free_messages(content: dict[str, Any], commentary: bool) -> dict[str, Any]:
    """``content`` after an optional analysis (and commentary) message, as vLLM assembles it."""
    free = [_free_message("analysis")] + ([_free_message("commentary")] if commentary else [])
    return sequence_format(*free, content)


def harmony_structural_tag(
    tools: list[dict[str, Any]], tool_choice: ToolChoice, single_call: bool
) -> dict[str, Any]:
    """vLLM's harmony tag for ``tools`` as ``tag_tools`` chose them (``single_call``: nothing to
    limit, a call message ends the turn)."""
    tags = [
        tag_format(
            header.format(name=tool_function(tool)["name"], channel=channel, constraint=constraint),
            json_schema_format(arguments_schema(tool)),
            _GRAMMAR_END,
        )
        for tool in tools
        for header in _CALL_HEADERS
        for constraint in _JSON_CONSTRAINTS
        for channel in _CALL_CHANNELS
    ]
    if tool_choice == "auto":
        tags += [
            tag_format(_FINAL_HEADER.format(constraint=c), any_text_format(), _GRAMMAR_END)
            for c in (*_JSON_CONSTRAINTS, "")
        ]
    return structural_tag(_after_free_messages(or_format(tags), commentary=True))


def harmony_output_format(fmt: dict[str, Any]) -> dict[str, Any]:
    """A request's structured output (a structural-tag format) as the final message's content,
    after an optional analysis message (vLLM's ``_adjust_output_format``)."""
    if fmt["type"] == "json_schema":
        content = or_format(
            [
                tag_format(_FINAL_HEADER.format(constraint=c), fmt, _GRAMMAR_END)
                for c in _JSON_CONSTRAINTS
            ]
        )
    else:
        content = tag_format(_FINAL_HEADER.format(constraint=""), fmt, _GRAMMAR_END)
    return _after_free_messages(content, commentary=False)


class GptOssToolParser(ToolParser):
    """Calls from the function-call messages ``openai_gptoss`` passes on in its content; the rest
    of that content is content. Not meant for raw gpt-oss output (vLLM never runs ``openai``
    without ``openai_gptoss``): a first message there has no ``<|start|>`` and would be content."""

    name = "openai"
    engine_based = True  # see GptOssReasoningParser
    # HarmonyParser reads required and named calls as any others.
    native_required_and_named = True

    def __init__(self) -> None:
        self._reader = _CallReader()

    def structural_tag(
        self, tools: list[dict[str, Any]], tool_choice: ToolChoice, single_call: bool
    ) -> dict[str, Any] | None:
        return harmony_structural_tag(tools, tool_choice, single_call)

    def wrap_output_format(self, fmt: dict[str, Any]) -> dict[str, Any]:
        return harmony_output_format(fmt)

    def extract(self, text: str) -> ToolCallResult:
        reader = _CallReader()
        pieces = reader.feed(text)
        content = "".join(t for what, t in pieces if what == "content") + reader.finish()
        calls = [
            ToolCall(c.name, _call_arguments(c.arguments, c.content_type)) for c in reader.calls
        ]
        return ToolCallResult(bool(calls), calls, content or None)

    def feed(self, delta_text: str) -> DeltaMessage | None:
        content = ""
        calls: list[DeltaToolCall] = []
        index = len(self._reader.calls) - 1  # the call that arguments go to
        for what, text in self._reader.feed(delta_text):
            if what == "content":
                content += text
            elif what == "open":
                index += 1
                # vLLM sends the name with the arguments that came in the same delta ("" if none).
                calls.append(DeltaToolCall(index, make_tool_call_id(), "function", text, ""))
            elif calls and calls[-1].index == index:
                calls[-1].arguments = (calls[-1].arguments or "") + text
            else:
                calls.append(DeltaToolCall(index, arguments=text))
        if not content and not calls:
            return None
        return DeltaMessage(content=content or None, tool_calls=calls)

    def finish(self) -> DeltaMessage | None:
        held = self._reader.finish()
        return DeltaMessage(content=held) if held else None
