"""``--tool-call-parser mistral``: vLLM 0.32's ``MistralToolParser``
(``vllm/tool_parsers/mistral_tool_parser.py``, an adapter over ``MistralParser`` in
``vllm/parser/mistral.py`` and its parser engine in ``vllm/parser/engine/``).

With a Hugging Face tokenizer vLLM picks the format from the vocabulary:

- ``[ARGS]`` in it (tokenizer v11+, e.g. Mistral Small 3.2, Magistral, Devstral 2507): calls are
  ``[TOOL_CALLS]name[ARGS]{...}`` (or ``[TOOL_CALLS]name{...}``), one marker per call, read by
  the declarative engine: ``MistralToolParser``, vLLM's ``mistral_config`` grammar run on
  ``gateway.parsers.marker_engine`` by ``MistralEngine``.
- no ``[ARGS]`` (pre-v11, e.g. Mistral 7B v0.3, Nemo, Small 3.1): calls are a JSON list after
  one marker, ``[TOOL_CALLS][{"name": ..., "arguments": {...}}]``, streamed through ``ijson``
  events: ``MistralPreV11ToolParser``.

``mistral_tool_parser(vocab)`` chooses as vLLM does; the registry's ``mistral`` is the v11+
parser. Tool call ids are Mistral's: 9 random alphanumerics.

v11+ behaviour (auto tool choice): text before the first marker is content (stripped, ``None``
if blank, when there are calls); the name runs to ``[ARGS]`` or ``{``; the arguments are the
first JSON value after it, or the raw text when it does not parse, ``{}`` when empty, and are
coerced to the request's tool schema (``tools=``) as vLLM's ``_fix_arg_types`` does. Streaming
sends the raw argument text as it arrives (no coercion, trailing text included), holding back
an outermost closing brace until more text or the end; a call cut off before its arguments
gets ``""`` streamed but ``{}`` whole; whitespace-only content is held back and dropped when a
call follows. ``[TOOL_CALLS]`` and ``[ARGS]`` (and ``[THINK]``/``[/THINK]``) are special tokens:
streamed, they count when whole inside one delta, as vLLM matches them by token id. vLLM also
drops its tokenizer's other special tokens (``</s>``...) from the text; this parser is given
none and keeps them.

Pre-v11 behaviour: see ``MistralPreV11ToolParser``.
"""

from __future__ import annotations

import functools
import json
import random
import re
from collections.abc import Container, Generator, Mapping, Sequence
from enum import Enum, auto
from string import ascii_letters, digits
from typing import Any

import ijson

from gateway.parsers.base import (
    DeltaMessage,
    DeltaToolCall,
    ParserContext,
    ToolCall,
    ToolCallResult,
    ToolParser,
)
from gateway.parsers.marker_engine.adapters import EngineToolParser, suppresses_calls
from gateway.parsers.marker_engine.call_pieces import Slot
from gateway.parsers.marker_engine.engine import Engine
from gateway.parsers.marker_engine.grammar import Ev, Grammar, State

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
THINK_START = "[THINK]"
THINK_END = "[/THINK]"
OPEN_BRACE = "{"
_ALPHANUMERIC = ascii_letters + digits


def make_mistral_tool_call_id() -> str:
    """Mistral's tool call id format (mistral-common validates it): 9 alphanumerics."""
    return "".join(random.choices(_ALPHANUMERIC, k=9))


@functools.cache
def mistral_grammar(think: bool) -> Grammar:
    """vLLM's ``mistral_config``: ``think`` is its ``special_token`` reasoning encoding
    ([THINK] in the vocabulary), otherwise ``none``."""
    content, reasoning = State.CONTENT, State.REASONING
    name, args = State.TOOL_NAME, State.TOOL_ARGS
    think_terminals = {"THINK_START": THINK_START, "THINK_END": THINK_END} if think else {}
    think_transitions = (
        {
            (content, "THINK_START"): (reasoning, ()),
            (reasoning, "THINK_START"): (reasoning, ()),  # a repeated one is dropped
            (reasoning, "THINK_END"): (content, (Ev.REASONING_END,)),
            (content, "THINK_END"): (content, ()),  # a stray one is dropped
            (reasoning, "TOOL_CALLS"): (name, (Ev.REASONING_END, Ev.TOOL_START)),
        }
        if think
        else {}
    )
    # A tool call ends reasoning implicitly.
    call_start = (Ev.REASONING_END, Ev.TOOL_START) if think else (Ev.TOOL_START,)
    # [TOOL_CALLS], [ARGS] and the think markers are tokens; "{" is text.
    tokens = {**think_terminals, "TOOL_CALLS": TOOL_CALLS, "ARGS": ARGS}
    return Grammar(
        terminals={**tokens, "OPEN_BRACE": OPEN_BRACE},
        token_terminals=tokens,
        transitions={
            **think_transitions,
            (content, "TOOL_CALLS"): (name, call_start),
            (name, "ARGS"): (args, ()),
            # The "{" that ends a name is the first character of the arguments.
            (name, "OPEN_BRACE"): (args, (Ev.ARGS,)),
            # The next call's marker ends the current call: there is no closing marker.
            (args, "TOOL_CALLS"): (name, (Ev.TOOL_END, Ev.TOOL_START)),
        },
        wait_for_reasoning=think,
    )


def _first_json_value(raw: str) -> str:
    """The first JSON value of the argument text (trailing text dropped), else the raw text."""
    stripped = raw.strip()
    if not stripped:
        return "{}"
    try:
        _, end = json.JSONDecoder().raw_decode(stripped)
    except json.JSONDecodeError:
        return stripped
    return stripped[:end]


class MistralEngine(Engine):
    """The engine with ``MistralParser``'s (v11+) hooks.

    ``think``: [THINK]/[/THINK] are markers (vLLM: ``[THINK]`` in the vocabulary and, for the
    tool parser, a reasoning parser configured; without one vLLM's tool parser reads them as
    plain text, which is what ``think=False`` does).
    """

    # The "{" that ends a name is sent as the first piece of the arguments.
    args_with_name = True

    def __init__(self, *, think: bool, tools: Sequence[Mapping[str, Any]] | None = None) -> None:
        self.think = think
        super().__init__(mistral_grammar(think), tools=tools)

    def accept_name(self, name: str) -> bool:
        # Once [ARGS] or "{" ended the name it is final, "" included: vLLM surfaces the
        # malformed call rather than dropping it.
        return True

    def ensure_id(self, slot: Slot) -> None:
        if not slot.id:
            slot.id = make_mistral_tool_call_id()

    def name_from_args(self, index: int) -> str | None:
        # No JSON "name" key in this format: an argument called "name" is not the tool's.
        return self.slots[index].name

    def name_and_args(self, raw_body: str) -> tuple[Any, str]:
        return "", self.extract_args_json(raw_body, "")

    def extract_args_json(self, raw_args: str, name: str) -> str:
        # No closing marker: text after the arguments' JSON is not part of them.
        return _first_json_value(raw_args)

    def extract_reasoning(self, text: str) -> tuple[str | None, str | None]:
        if not self.think:
            return None, text
        return super().extract_reasoning(text)


class MistralToolParser(EngineToolParser):
    """v11+ ``[TOOL_CALLS]name[ARGS]{...}`` calls.

    ``tools``: the request's tools (OpenAI dicts), for vLLM's schema coercion of whole outputs.
    ``reasoning``: a ``mistral`` reasoning parser runs first (the vocabulary has [THINK]); vLLM
    then reads [THINK]/[/THINK] in the content too (a stray [/THINK] is dropped, text after a
    stray [THINK] becomes reasoning). Without it they are plain text, as in vLLM.
    """

    name = "mistral"
    # vLLM holds forced Mistral calls to a schema of its own and reads them with this parser
    # (not its generic JSON path); not reproduced yet.
    forced_calls_supported = False

    @classmethod
    def for_request(cls, context: ParserContext) -> ToolParser:  # type: ignore[override]
        # The vocabulary picks the format: [ARGS] means v11+ calls, else the JSON list.
        return mistral_tool_parser(
            context.vocab,
            tools=list(context.tools or []),
            reasoning=context.reasoning_parser == "mistral",
            suppress_calls=suppresses_calls(context),
        )

    def __init__(
        self,
        *,
        tools: list[dict[str, Any]] | None = None,
        reasoning: bool = False,
        suppress_calls: bool = False,
    ) -> None:
        engine = MistralEngine(think=reasoning, tools=tools)
        super().__init__(engine, after_reasoning_parser=reasoning, suppress_calls=suppress_calls)


class _LegacyState(Enum):
    WAITING_FOR_TOOL_START = auto()
    WAITING_FOR_TOOL_KEY = auto()
    PARSING_NAME = auto()
    PARSING_NAME_COMPLETED = auto()
    WAITING_FOR_ARGUMENTS_START = auto()
    PARSING_ARGUMENTS = auto()
    PARSING_ARGUMENTS_COMPLETED = auto()
    TOOL_COMPLETE = auto()
    ALL_TOOLS_COMPLETE = auto()


# Per state, after which structural characters a delta is cut before it goes to the JSON
# parser, so that the state seen after each piece says what that piece was.
_STOP_AFTER: dict[_LegacyState, str] = {
    _LegacyState.WAITING_FOR_TOOL_START: "{",
    _LegacyState.WAITING_FOR_TOOL_KEY: ":{}",
    _LegacyState.PARSING_NAME: ",]}",
    _LegacyState.WAITING_FOR_ARGUMENTS_START: "{}",
    _LegacyState.PARSING_ARGUMENTS: "}",
    _LegacyState.PARSING_ARGUMENTS_COMPLETED: "}]",
    _LegacyState.PARSING_NAME_COMPLETED: "}]",
    _LegacyState.TOOL_COMPLETE: "{]",
}
_LIST_RE = re.compile(r"\[{.*}\]", re.DOTALL)


def _legacy_calls(parsed: Any) -> list[ToolCall]:
    """vLLM's ``_pre_v11_function_calls``: a bare object is one call, non-call entries are
    skipped, a missing name is ``""``, string arguments are kept as they are."""
    entries = [parsed] if isinstance(parsed, dict) else parsed
    if not isinstance(entries, list):
        return []
    calls: list[ToolCall] = []
    for entry in entries:
        if not isinstance(entry, dict) or ("name" not in entry and "arguments" not in entry):
            continue
        name, arguments = entry.get("name"), entry.get("arguments")
        if arguments is None:
            arguments = "{}"
        elif not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        calls.append(
            ToolCall(
                name=name if isinstance(name, str) else "",
                arguments=arguments,
                id=make_mistral_tool_call_id(),
            )
        )
    return calls


class MistralPreV11ToolParser(ToolParser):
    """Pre-v11 ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` calls (vLLM's legacy
    path in ``MistralParser``, used when the vocabulary has no ``[ARGS]``).

    Non-streaming: content is the text before the marker (``None`` if blank); the first JSON
    value after it (else the first ``[{...}]`` in it) holds the calls; text after is dropped.
    When no call is found the content is the text after the marker, stripped (what was before
    is lost, as in vLLM). Streaming: content passes through until a delta holds the marker;
    then the JSON goes through ``ijson`` piece by piece, names are sent whole, argument objects
    as their raw text (string arguments decoded), and text after the list is content again. A
    JSON error silences the rest of the stream.
    """

    name = "mistral"
    keeps_special_tokens = True  # vLLM's Mistral adjust_request turns skipping off
    forced_calls_supported = False  # as MistralToolParser

    def __init__(self) -> None:
        self._started = False
        self._state = _LegacyState.WAITING_FOR_TOOL_START
        self._tool_id = -1
        self._new_tool = False
        self._name: str | None = None
        self._string_args: str | None = None
        self._pending_id: str | None = None
        self._json = ijson.parse_coro(self._on_events())

    def extract(self, text: str) -> ToolCallResult:
        if TOOL_CALLS not in text:
            return ToolCallResult(False, [], text or None)
        # Repeated markers count as one; the JSON is the first non-blank segment.
        before, *segments = text.split(TOOL_CALLS)
        body = next((s.strip() for s in segments if s.strip()), "")
        try:
            parsed, _ = json.JSONDecoder().raw_decode(body)
        except json.JSONDecodeError:
            found = _LIST_RE.findall(body)
            try:
                parsed = json.loads(found[0]) if found else None
            except json.JSONDecodeError:
                parsed = None
        calls = _legacy_calls(parsed)
        if not calls:
            return ToolCallResult(False, [], body or None)
        return ToolCallResult(True, calls, before if before.strip() else None)

    def feed(self, delta_text: str) -> DeltaMessage | None:
        if TOOL_CALLS in delta_text:
            self._started = True
        if not self._started:
            return DeltaMessage(content=delta_text)
        try:
            return self._stream(delta_text)
        except Exception:
            return None  # vLLM logs it and sends nothing; ijson stays failed afterwards

    @ijson.coroutine
    def _on_events(self) -> Generator[None, tuple[str, str, Any], None]:
        """vLLM's ``update_stream_state_pre_v11_tokenizer``: ijson events to states."""
        bare_object = False
        s = _LegacyState
        while True:
            prefix, event, value = yield
            if prefix == "" and event == "start_map":
                bare_object = True  # a lone call object: read as the list's only item
            if bare_object:
                prefix = f"item.{prefix}" if prefix else "item"
            if prefix == "item" and event == "start_map":
                self._state, self._new_tool = s.WAITING_FOR_TOOL_KEY, True
            if prefix == "item" and event == "map_key" and value == "name":
                self._state = s.PARSING_NAME
            if prefix == "item.name" and event == "string":
                self._name, self._state = value, s.PARSING_NAME_COMPLETED
            if prefix == "item" and event == "map_key" and value == "arguments":
                self._state = s.WAITING_FOR_ARGUMENTS_START
            if prefix == "item.arguments" and event == "start_map":
                self._state = s.PARSING_ARGUMENTS
            if prefix == "item.arguments" and event == "end_map":
                self._state = s.PARSING_ARGUMENTS_COMPLETED
            if prefix == "item.arguments" and event == "string":
                self._string_args = value
            if prefix == "item" and event == "end_map":
                self._state = s.ALL_TOOLS_COMPLETE if bare_object else s.TOOL_COMPLETE
            if prefix == "" and event == "end_array":
                self._state = s.ALL_TOOLS_COMPLETE

    def _stream(self, delta_text: str) -> DeltaMessage | None:
        content = None
        pieces: list[DeltaToolCall] = []
        current = DeltaToolCall(self._tool_id, type="function")
        modified = False
        if TOOL_CALLS in delta_text:
            before, *after = delta_text.split(TOOL_CALLS)
            content = before or None
            delta_text = "".join(after)
        s = _LegacyState
        while delta_text:
            state_before = self._state
            if self._state == s.ALL_TOOLS_COMPLETE:
                content, delta_text = delta_text, ""
                break
            piece, delta_text = _cut(delta_text, _STOP_AFTER[self._state])
            self._json.send(piece.encode("utf-8"))
            if self._new_tool:
                self._new_tool = False
                if modified:
                    pieces.append(self._finish_piece(current))
                modified = False
                self._tool_id += 1
                self._pending_id = make_mistral_tool_call_id()
                current = DeltaToolCall(self._tool_id, type="function")
            if self._name is not None:
                modified, current.name, self._name = True, self._name, None
            if self._string_args is not None:
                modified, current.arguments, self._string_args = True, self._string_args, None
            if self._state == s.PARSING_NAME_COMPLETED:
                self._state = s.WAITING_FOR_TOOL_KEY
            if self._state in (s.PARSING_ARGUMENTS, s.PARSING_ARGUMENTS_COMPLETED):
                if self._state == s.PARSING_ARGUMENTS_COMPLETED:
                    self._state = s.WAITING_FOR_TOOL_KEY
                modified = True
                current.arguments = (current.arguments or "") + piece
                if state_before != s.PARSING_ARGUMENTS:
                    current.arguments = current.arguments.lstrip()  # the object's first piece
        if modified:
            pieces.append(self._finish_piece(current))
        if content or pieces:
            return DeltaMessage(content=content or None, tool_calls=pieces)
        # vLLM sends an empty delta once the list closed.
        return DeltaMessage() if self._state == s.ALL_TOOLS_COMPLETE else None

    def _finish_piece(self, piece: DeltaToolCall) -> DeltaToolCall:
        if self._pending_id is not None:
            piece.id, self._pending_id = self._pending_id, None
        return piece


def _cut(text: str, stops: str) -> tuple[str, str]:
    """``text`` cut after its first character in ``stops`` (all of it if none)."""
    for i, ch in enumerate(text):
        if ch in stops:
            return text[: i + 1], text[i + 1 :]
    return text, ""


def mistral_tool_parser(
    vocab: Container[str],
    *,
    tools: list[dict[str, Any]] | None = None,
    reasoning: bool = False,
    suppress_calls: bool = False,
) -> ToolParser:
    """The ``mistral`` tool parser vLLM uses with this (Hugging Face) vocabulary."""
    if ARGS not in vocab:
        return MistralPreV11ToolParser()
    return MistralToolParser(
        tools=tools, reasoning=reasoning and THINK_START in vocab, suppress_calls=suppress_calls
    )
