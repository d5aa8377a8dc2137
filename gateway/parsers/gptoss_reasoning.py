"""gpt-oss's harmony format and ``--reasoning-parser openai_gptoss`` (``--tool-call-parser openai``
reads what it passes on).

In vLLM 0.32 these names register stubs (``vllm/reasoning/gptoss_reasoning_parser.py``
``GptOssReasoningParser``, ``vllm/tool_parsers/gptoss_tool_parser.py`` ``GptOssToolParser``): for a
``gpt_oss`` model the server builds ``vllm/parser/harmony.py`` ``HarmonyParser`` instead, which
feeds the output token ids to ``openai_harmony``'s ``StreamableParser`` and reads reasoning,
content and tool calls from its messages. vLLM also makes ``openai_gptoss`` the default reasoning
parser of gpt-oss, so ``openai`` never runs without it. The output is a run of messages::

    <|channel|>analysis<|message|>…<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>
    {"city": "Paris"}<|call|>

(the first message has no ``<|start|>assistant``: the prompt ends with it). Behaviour reproduced:

- A header is the text before ``<|message|>``, read by harmony's rules (channel after
  ``<|channel|>``, recipient after ``to=``, an optional content type). A header that does not
  parse drops its message. A message ends at ``<|end|>``, ``<|call|>``, ``<|return|>`` or the end
  of the output; any other marker inside it is text. Text between a message's end and the next
  ``<|start|>`` is dropped.
- A message to a function recipient (``functions.x``, or a bare name other than the built-in
  tools) is a tool call; ``analysis`` is reasoning; ``final``, and ``commentary`` without a
  recipient, are content; anything else is dropped.
- Output cut off inside a header: the text since the last message ended, markers included,
  becomes content (vLLM's recovery when harmony rejects the end of the output).
- Non-streaming joins the reasoning and the content parts with "\\n", drops messages of roles
  other than assistant, and re-serialises JSON arguments with ``json.dumps`` (ASCII escapes);
  streaming does none of that.

The gateway runs a reasoning parser, then the tool parser on its content. So that ``openai`` can
see the calls, ``openai_gptoss`` passes each function-call message on inside its content as
harmony text (``<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>
{…}<|call|>``), and ``openai`` turns those back into calls and keeps the rest as content. Without a
tool parser vLLM drops calls: build ``GptOssReasoningParser(pass_tool_calls=False)`` then.

Text-only: the chat service detokenizes with special tokens kept, and every marker is one special
token, so markers are found within a delta. A marker the model spells out in ordinary tokens
reads the same as the special token here (vLLM would keep it as text); nothing can tell them
apart without token ids.

The ``openai`` tool parser, which reads what this one passes on, is in ``gptoss_tool``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from gateway.parsers.base import (
    DeltaMessage,
    ParserContext,
    ReasoningParser,
    ReasoningResult,
)

START = "<|start|>"
CHANNEL = "<|channel|>"
MESSAGE = "<|message|>"
CONSTRAIN = "<|constrain|>"
CALL = "<|call|>"
MESSAGE_ENDS = ("<|end|>", CALL, "<|return|>")

_ROLES = frozenset({"user", "assistant", "system", "developer", "tool"})
# vLLM's BUILTIN_TOOL_TO_MCP_SERVER_LABEL: recipients that are not function calls.
_BUILTIN_TOOLS = frozenset({"python", "browser", "container"})
# Rust's char::is_whitespace (Unicode White_Space): ends a channel name, and what trim() strips.
_WHITESPACE = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
    "\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
# Rust's split_ascii_whitespace, which splits the header into parts (no \x0b).
_ASCII_WHITESPACE_RE = re.compile(r"[ \t\n\x0c\r]+")


class HeaderError(ValueError):
    """A header harmony rejects; its message is dropped."""


@dataclass(frozen=True)
class Header:
    role: str
    channel: str | None
    recipient: str | None
    content_type: str | None


class Kind(Enum):
    """vLLM's ``_SegmentType``: what a message's text becomes."""

    TOOL = "tool"
    REASONING = "reasoning"
    CONTENT = "content"
    IGNORE = "ignore"


def _take_channel(text: str) -> tuple[str | None, str]:
    """(channel, header without it): the first ``<|channel|>`` and the name after it."""
    idx = text.find(CHANNEL)
    if idx == -1:
        return None, text
    after = text[idx + len(CHANNEL) :]
    end = next((i for i, c in enumerate(after) if c in _WHITESPACE or c == "<"), len(after))
    if end == 0:
        raise HeaderError("channel marker without a channel")
    return after[:end], text[:idx] + after[end:]


def _take_role(parts: list[str], role: str | None) -> str:
    """The role (from ``parts`` when not known in advance); removes it from ``parts``."""
    if role is None:
        if not parts:
            raise HeaderError("header without a role")
        role = parts[0]
        if role not in _ROLES:
            # Harmony reads an unknown first word as a tool's name when a recipient may follow.
            if len(parts) == 1 and not role.startswith("to="):
                raise HeaderError(f"unknown role {role!r}")
            parts.pop(0)
            role = "tool"
    if parts and parts[0] == role:
        parts.pop(0)
    return role


def _normalize_recipient(recipient: str | None) -> str | None:
    """vLLM's ``HarmonyParser._normalize_recipient``: cut a constrained format off."""
    if recipient is None:
        return None
    idx = recipient.find(CONSTRAIN)
    return recipient if idx == -1 else recipient[:idx].rstrip() or None


def parse_header(text: str, role: str | None) -> Header:
    """A message header by harmony's ``parse_header_from_string`` (``role`` when already known).

    Raises ``HeaderError`` where harmony does.
    """
    channel, text = _take_channel(text)
    text = text.strip(_WHITESPACE)
    if CONSTRAIN in text:
        # "to=f<|constrain|>json" is a recipient and a content type.
        text = text.replace(CONSTRAIN, " " + CONSTRAIN).strip(_WHITESPACE)
    parts = [p for p in _ASCII_WHITESPACE_RE.split(text) if p]
    role = _take_role(parts, role)
    recipient = content_type = None
    if parts:
        count = len(parts)
        last = parts.pop()
        if last.startswith("to="):
            recipient = last[3:]
        elif count == 1:
            recipient = last
        else:
            content_type = last
            raw = parts.pop()
            recipient = raw[3:] if raw.startswith("to=") else raw
        if parts:
            raise HeaderError(f"unexpected text in header: {parts!r}")
    return Header(role, channel, _normalize_recipient(recipient), content_type)


def is_function_recipient(recipient: str | None) -> bool:
    """vLLM's ``is_function_recipient`` as the chat completions server calls it."""
    if not recipient or recipient.startswith("<|"):
        return False
    if recipient.startswith("functions."):
        return len(recipient) > len("functions.")
    if recipient == "assistant" or recipient in _BUILTIN_TOOLS:
        return False
    return recipient.split(".", 1)[0] not in _BUILTIN_TOOLS


def kind_of(header: Header) -> Kind:
    if is_function_recipient(header.recipient):
        return Kind.TOOL
    if header.channel == "analysis":
        return Kind.REASONING
    if header.channel == "final" or (header.channel == "commentary" and header.recipient is None):
        return Kind.CONTENT
    return Kind.IGNORE


def first_message_end(text: str) -> tuple[int, str] | None:
    """(index, marker) of the first message end in ``text``, if any."""
    found = [(i, m) for m in MESSAGE_ENDS if (i := text.find(m)) != -1]
    return min(found) if found else None


def call_header(header: Header) -> str:
    """The harmony header a call is passed on with (re-parses to the same recipient and type)."""
    channel = f"{CHANNEL}{header.channel}" if header.channel else ""
    content_type = f" {header.content_type}" if header.content_type else ""
    return f"{START}assistant{channel} to={header.recipient}{content_type}{MESSAGE}"


@dataclass(frozen=True)
class _Event:
    """What the output says next: a message opened, text of it, it closed (``text`` is all of
    it), or text recovered from a header cut off at the end (``header`` is ``None``)."""

    kind: str  # "open" | "text" | "close" | "recovered"
    header: Header | None
    text: str = ""


class _State(Enum):
    EXPECT_START = "expect_start"
    HEADER = "header"
    CONTENT = "content"


class _HarmonyReader:
    """Harmony's ``StreamableParser`` for the assistant (strict, as vLLM builds it), on text."""

    def __init__(self) -> None:
        self._state = _State.HEADER
        # The first header comes after the prompt's "<|start|>assistant"; harmony keeps that
        # role until a header parses.
        self._next_role: str | None = "assistant"
        self._header_text = ""
        self._header: Header | None = None
        self._body: list[str] = []
        # vLLM's _current_message_tokens: what it decodes when the output ends in a header.
        self._since_message = ""

    def feed(self, delta: str) -> list[_Event]:
        events: list[_Event] = []
        while delta:
            if self._state is _State.EXPECT_START:
                delta = self._expect_start(delta)
            elif self._state is _State.HEADER:
                delta = self._read_header(delta, events)
            else:
                delta = self._read_content(delta, events)
        return events

    def finish(self) -> list[_Event]:
        if self._state is _State.CONTENT:
            return [self._close()]
        if self._state is _State.HEADER and self._since_message:
            return [_Event("recovered", None, self._since_message)]
        return []

    def _expect_start(self, delta: str) -> str:
        # Harmony rejects every token but <|start|> here; vLLM skips the rejected ones.
        idx = delta.find(START)
        if idx == -1:
            return ""
        self._state, self._header_text = _State.HEADER, ""
        self._since_message += START
        return delta[idx + len(START) :]

    def _read_header(self, delta: str, events: list[_Event]) -> str:
        idx = delta.find(MESSAGE)
        text = delta if idx == -1 else delta[:idx]
        self._header_text += text
        self._since_message += text
        if idx == -1:
            return ""
        try:
            header = parse_header(self._header_text, self._next_role)
        except HeaderError:
            self._state = _State.EXPECT_START
        else:
            self._state, self._header, self._body = _State.CONTENT, header, []
            self._next_role = None
            events.append(_Event("open", header))
        return delta[idx + len(MESSAGE) :]

    def _read_content(self, delta: str, events: list[_Event]) -> str:
        end = first_message_end(delta)
        text = delta if end is None else delta[: end[0]]
        if text:
            self._body.append(text)
            events.append(_Event("text", self._header, text))
        if end is None:
            return ""
        events.append(self._close())
        return delta[end[0] + len(end[1]) :]

    def _close(self) -> _Event:
        self._state, self._since_message = _State.EXPECT_START, ""
        return _Event("close", self._header, "".join(self._body))


class GptOssReasoningParser(ReasoningParser):
    """Reasoning from ``analysis`` messages; content, with function calls passed on as harmony
    text for the ``openai`` tool parser (``pass_tool_calls=False`` drops them, as vLLM does when
    no tool parser is configured)."""

    name = "openai_gptoss"
    # Harmony is parsed in one pass by vLLM (HarmonyParser): calls are read, and dropped,
    # under tool_choice "none" too, as for its engine-based parsers.
    engine_based = True

    def prompt_ends_reasoning(self, prompt_tokens: Sequence[str]) -> bool:
        # vLLM's harmony parser says so for every prompt: a grammar then applies to the
        # whole output, which frames it in the final channel itself.
        return True

    @classmethod
    def for_request(cls, context: ParserContext) -> GptOssReasoningParser:
        # The calls are the tool parser's to read; without one vLLM drops them.
        return cls(pass_tool_calls=context.tool_parser is not None)

    def __init__(self, pass_tool_calls: bool = True) -> None:
        self._pass_calls = pass_tool_calls
        self._reader = _HarmonyReader()

    @property
    def reasoning_ended(self) -> bool:
        # vLLM's is_reasoning_end is always True for harmony: every delta may carry content.
        return True

    def extract(self, text: str) -> ReasoningResult:
        reader = _HarmonyReader()
        reasoning: list[str] = []
        content, separator = "", ""
        for event in [*reader.feed(text), *reader.finish()]:
            kind, part = self._whole_message(event)
            if kind is Kind.REASONING:
                reasoning.append(part)
            elif kind is Kind.CONTENT:
                content, separator = content + separator + part, "\n"
            elif kind is Kind.TOOL:
                content += part  # between the content parts: the tool parser takes it out
        return ReasoningResult("\n".join(reasoning) or None, content or None)

    def _whole_message(self, event: _Event) -> tuple[Kind, str]:
        """What a finished message adds to a whole output: vLLM's parse keeps assistant messages
        only and skips empty reasoning and content (not empty calls)."""
        if event.kind == "recovered":
            return Kind.CONTENT, event.text
        header = event.header
        if event.kind != "close" or header is None or header.role != "assistant":
            return Kind.IGNORE, ""
        kind = kind_of(header)
        if kind is Kind.TOOL:
            if not self._pass_calls:
                return Kind.IGNORE, ""
            return kind, call_header(header) + event.text + CALL
        return (kind, event.text) if event.text else (Kind.IGNORE, "")

    def feed(self, delta_text: str) -> DeltaMessage | None:
        return self._delta(self._reader.feed(delta_text))

    def finish(self) -> DeltaMessage | None:
        return self._delta(self._reader.finish())

    def _delta(self, events: list[_Event]) -> DeltaMessage | None:
        reasoning, content = "", ""
        for event in events:
            if event.header is None:
                content += event.text
                continue
            kind = kind_of(event.header)
            if kind is Kind.TOOL:
                if self._pass_calls:
                    content += self._call_piece(event)
            elif event.kind == "text" and kind is Kind.REASONING:
                reasoning += event.text
            elif event.kind == "text" and kind is Kind.CONTENT:
                content += event.text
        if not reasoning and not content:
            return None
        return DeltaMessage(reasoning=reasoning or None, content=content or None)

    @staticmethod
    def _call_piece(event: _Event) -> str:
        assert event.header is not None
        if event.kind == "open":
            return call_header(event.header)
        return CALL if event.kind == "close" else event.text
