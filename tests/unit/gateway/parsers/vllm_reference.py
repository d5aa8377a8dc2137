"""vLLM's own parsers as the reference for gateway.parsers, run the way its OpenAI server runs
them: the composed ``DelegatingParser`` from ``ParserManager.get_parser`` (``parse`` for a whole
output, ``parse_delta`` per streamed delta). Imports vLLM parser modules only, no engine.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.parsers import DeltaMessage, ReasoningParser, ToolParser

MARKERS = ("<think>", "</think>", "<tool_call>", "</tool_call>")
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
TOOL_ID_RE = re.compile(r"chatcmpl-tool-[0-9a-f]{16}")


@functools.cache
def tokenizer(markers: tuple[str, ...] = MARKERS, special: tuple[str, ...] = ()) -> Any:
    """The tiny Qwen tokenizer with ``markers`` as single non-special tokens and ``special`` as
    single special tokens (a parser family passes its own marker strings)."""
    from tokenizers import AddedToken

    from engine_server.tiny_models import QWEN2_CHAT_TEMPLATE, qwen_tokenizer

    tok = qwen_tokenizer(QWEN2_CHAT_TEMPLATE)
    tok.add_tokens([AddedToken(m, special=False, normalized=False) for m in markers])
    if special:
        tok.add_special_tokens({"additional_special_tokens": list(special)})
    return tok


@dataclass
class Assembled:
    """A stream folded back together: what a client ends up with."""

    reasoning: str = ""
    content: str = ""
    calls: dict[int, list[str]] = field(default_factory=dict)  # index -> [name, arguments]
    ids: dict[int, str] = field(default_factory=dict)

    def add(self, reasoning: str | None, content: str | None, calls: Iterable[tuple]) -> None:
        self.reasoning += reasoning or ""
        self.content += content or ""
        for index, call_id, name, arguments in calls:
            entry = self.calls.setdefault(index, ["", ""])
            entry[0] += name or ""
            entry[1] += arguments or ""
            if call_id is not None:
                self.ids[index] = call_id

    def comparable(self) -> tuple:
        # Ids are random on both sides: compare only that each call got one of vLLM's format.
        assert all(TOOL_ID_RE.fullmatch(i) for i in self.ids.values()), self.ids
        assert set(self.ids) == set(self.calls), (self.ids, self.calls)
        return self.reasoning, self.content, self.calls


def _request(tools: list[dict] | None = None) -> Any:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": "hi"}], tools=tools or TOOLS
    )


def _vllm_parser(tool: str | None, reasoning: str | None, tok: Any, tools: list[dict]) -> Any:
    from vllm.parser.parser_manager import ParserManager

    # vLLM logs a traceback for every body its parsers fail to read; expected here.
    for name in ("vllm.tool_parsers", "vllm.parser", "vllm.reasoning"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    cls = ParserManager.get_parser(
        tool_parser_name=tool, reasoning_parser_name=reasoning, enable_auto_tools=True
    )
    return cls(tok, tools)


def vllm_whole(
    text: str,
    *,
    tool: str | None = None,
    reasoning: str | None = None,
    tok: Any = None,
    tools: list[dict] | None = None,
) -> tuple[str | None, str | None, list[tuple[str, str]]]:
    """vLLM's non-streamed (reasoning, content, [(name, arguments)]).

    ``tok`` defaults to ``tokenizer()``; ``tools`` to ``TOOLS``."""
    tools = tools or TOOLS
    parser = _vllm_parser(tool, reasoning, tok or tokenizer(), tools)
    got_reasoning, content, calls = parser.parse(text, _request(tools), enable_auto_tools=True)
    return got_reasoning, content, [(c.name, c.arguments) for c in calls or []]


def vllm_stream(
    deltas: Sequence[str],
    *,
    tool: str | None = None,
    reasoning: str | None = None,
    tok: Any = None,
    tools: list[dict] | None = None,
) -> Assembled:
    """vLLM's streamed output for these deltas, as the server feeds them (ids per delta)."""
    tok = tok or tokenizer()
    tools = tools or TOOLS
    parser, request = _vllm_parser(tool, reasoning, tok, tools), _request(tools)
    prompt_ids = tok.encode("<|im_start|>assistant\n")
    out = Assembled()
    for i, delta in enumerate(deltas):
        msg = parser.parse_delta(
            delta, tok.encode(delta), request, prompt_ids, finished=i == len(deltas) - 1
        )
        if msg is not None:
            calls = [
                (c.index, c.id, c.function and c.function.name, c.function and c.function.arguments)
                for c in msg.tool_calls
            ]
            out.add(msg.reasoning, msg.content, calls)
    return out


def our_stream(parser: ReasoningParser | ToolParser, deltas: Sequence[str]) -> Assembled:
    out = Assembled()
    messages: list[DeltaMessage | None] = [parser.feed(d) for d in deltas] + [parser.finish()]
    for msg in messages:
        if msg is not None:
            calls = [(c.index, c.id, c.name, c.arguments) for c in msg.tool_calls]
            out.add(msg.reasoning, msg.content, calls)
    return out


def token_deltas(text: str, tok: Any = None) -> list[str]:
    """The deltas a token-by-token stream sends: a token that ends mid-character is held back
    until the character is complete, as vLLM's incremental detokenizer does."""
    tok = tok or tokenizer()
    ids = tok.encode(text)
    deltas, sent = [], ""
    for n in range(1, len(ids) + 1):
        decoded = tok.decode(ids[:n], skip_special_tokens=False)
        if not decoded.endswith("\ufffd"):
            deltas.append(decoded[len(sent) :])
            sent = decoded
    assert sent == text
    return deltas


def two_delta_splits(text: str) -> list[list[str]]:
    """Every split of ``text`` into two non-empty deltas."""
    return [[text[:i], text[i:]] for i in range(1, len(text))]


@functools.cache
def _vllm_parser_class(tool: str | None, reasoning: str | None) -> Any:
    from vllm.parser.parser_manager import ParserManager

    # vLLM logs a traceback for every body its parsers fail to read; expected here.
    for name in ("vllm.tool_parsers", "vllm.parser", "vllm.reasoning"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    return ParserManager.get_parser(
        tool_parser_name=tool, reasoning_parser_name=reasoning, enable_auto_tools=True
    )


def _vllm_parser_kwargs(
    tool: str | None, reasoning: str | None, tok: Any, tools: list[dict], kwargs: dict | None
) -> Any:
    """``_vllm_parser`` built the way the server builds it per request, with the request's
    ``chat_template_kwargs`` (parsers such as kimi_k2 or deepseek_v3 read them); the composed
    class is built once, as the server does."""
    extra = {} if kwargs is None else {"chat_template_kwargs": dict(kwargs)}
    return _vllm_parser_class(tool, reasoning)(tok, tools, **extra)


def vllm_whole_with_ids(
    text: str,
    *,
    tool: str | None = None,
    reasoning: str | None = None,
    tok: Any = None,
    tools: list[dict] | None = None,
    chat_template_kwargs: dict | None = None,
) -> tuple[str | None, str | None, list[tuple[str | None, str, str]]]:
    """``vllm_whole`` with ``chat_template_kwargs``; calls as (id, name, arguments)."""
    tools = tools or TOOLS
    parser = _vllm_parser_kwargs(tool, reasoning, tok or tokenizer(), tools, chat_template_kwargs)
    got_reasoning, content, calls = parser.parse(text, _request(tools), enable_auto_tools=True)
    return got_reasoning, content, [(c.id, c.name, c.arguments) for c in calls or []]


def vllm_stream_kwargs(
    deltas: Sequence[str],
    *,
    tool: str | None = None,
    reasoning: str | None = None,
    tok: Any = None,
    tools: list[dict] | None = None,
    chat_template_kwargs: dict | None = None,
) -> Assembled:
    """``vllm_stream`` with ``chat_template_kwargs``."""
    tok = tok or tokenizer()
    tools = tools or TOOLS
    parser = _vllm_parser_kwargs(tool, reasoning, tok, tools, chat_template_kwargs)
    request, prompt_ids = _request(tools), tok.encode("<|im_start|>assistant\n")
    out = Assembled()
    for i, delta in enumerate(deltas):
        msg = parser.parse_delta(
            delta, tok.encode(delta), request, prompt_ids, finished=i == len(deltas) - 1
        )
        if msg is not None:
            calls = [
                (c.index, c.id, c.function and c.function.name, c.function and c.function.arguments)
                for c in msg.tool_calls
            ]
            out.add(msg.reasoning, msg.content, calls)
    return out


def vllm_prompt_ends_reasoning(
    prompt: str, *, reasoning: str, tok: Any, chat_template_kwargs: dict | None = None
) -> tuple[bool, list[str]]:
    """vLLM's ``is_reasoning_end`` on a prompt, and the prompt's tokens as strings (what
    ``ReasoningParser.prompt_ends_reasoning`` reads)."""
    ids = tok.encode(prompt)
    parser = _vllm_parser_kwargs(None, reasoning, tok, TOOLS, chat_template_kwargs)
    return parser.is_reasoning_end(ids), [tok.decode([i]) for i in ids]


class ReasoningThenTools:
    """A reasoning parser chained into a tool parser, as the chat service chains them: content
    out of the reasoning parser feeds the tool parser once reasoning has ended; the tool
    parser's end-of-stream flush may carry call pieces (and reasoning it found)."""

    def __init__(self, reasoning: ReasoningParser, tools: ToolParser) -> None:
        self.reasoning, self.tools = reasoning, tools

    def run(self, deltas: list[str]) -> Assembled:
        out = Assembled()
        for delta in deltas:
            self._route(out, self.reasoning.feed(delta))
        self._route(out, self.reasoning.finish())
        self._add(out, self.tools.finish())
        return out

    def _route(self, out: Assembled, msg: DeltaMessage | None) -> None:
        if msg is None:
            return
        out.add(msg.reasoning, None, [])
        if msg.content and self.reasoning.reasoning_ended:
            self._add(out, self.tools.feed(msg.content))
        elif msg.content:
            out.add(None, msg.content, [])

    @staticmethod
    def _add(out: Assembled, msg: DeltaMessage | None) -> None:
        if msg is not None:
            calls = [(c.index, c.id, c.name, c.arguments) for c in msg.tool_calls]
            out.add(msg.reasoning, msg.content, calls)
