"""openai_gptoss reasoning and openai tool parsers (gpt-oss harmony) against vLLM 0.32.

For a gpt-oss model vLLM's server does not run these names' classes (stubs) but ``HarmonyParser``
(``ParserManager.get_parser(..., is_harmony=True)``), which reads the output token ids with
``openai_harmony``; the reference here runs it that way, on ids from the o200k_harmony encoding
(which ``openai_harmony`` ships, so no download).
"""

from __future__ import annotations

import functools
import logging
import random
import re
from typing import Any

import pytest

from gateway.parsers import ReasoningResult, reasoning_parser, tool_parser
from gateway.parsers.gptoss_reasoning import GptOssReasoningParser
from gateway.parsers.gptoss_tool import GptOssToolParser
from tests.unit.gateway.parsers.vllm_reference import TOOL_ID_RE, TOOLS, Assembled, token_deltas

Calls = list[tuple[str, str]]


class _HarmonyTokenizer:
    """gpt-oss's tokenizer as far as the reference needs it: special tokens are single ids."""

    def __init__(self) -> None:
        from openai_harmony import HarmonyEncodingName, load_harmony_encoding

        self._enc = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)

    def encode(self, text: str) -> list[int]:
        return self._enc.encode(text, allowed_special="all")

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        assert not skip_special_tokens  # HarmonyParser's recovery decodes with the markers
        return self._enc.decode(ids, errors="replace")


@functools.cache
def _tok() -> _HarmonyTokenizer:
    return _HarmonyTokenizer()


@functools.cache
def _request() -> Any:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": "hi"}], tools=TOOLS
    )


def _vllm_parser(tools: bool) -> Any:
    from vllm.parser.parser_manager import ParserManager

    logging.getLogger("vllm.parser").setLevel(logging.CRITICAL)  # it warns on recovery
    cls = ParserManager.get_parser(
        tool_parser_name="openai" if tools else None,
        reasoning_parser_name="openai_gptoss",
        enable_auto_tools=True,
        is_harmony=True,
    )
    return cls(_tok(), TOOLS)


def vllm_whole(text: str, tools: bool) -> tuple[str | None, str | None, Calls]:
    parser = _vllm_parser(tools)
    reasoning, content, calls = parser.parse(
        text, _request(), enable_auto_tools=True, model_output_token_ids=_tok().encode(text)
    )
    return reasoning, content, [(c.name, c.arguments) for c in calls or []]


def vllm_stream(deltas: list[str], tools: bool) -> Assembled:
    parser, out = _vllm_parser(tools), Assembled()
    for i, delta in enumerate(deltas):
        msg = parser.parse_delta(
            delta, _tok().encode(delta), _request(), [], finished=i == len(deltas) - 1
        )
        if msg is not None:
            calls = [
                (c.index, c.id, c.function and c.function.name, c.function and c.function.arguments)
                for c in msg.tool_calls
            ]
            out.add(msg.reasoning, msg.content, calls)
    return out


def our_whole(text: str, tools: bool) -> tuple[str | None, str | None, Calls]:
    """What the chat service does: the reasoning parser, then the tool parser on its content."""
    split = GptOssReasoningParser(pass_tool_calls=tools).extract(text)
    if not tools:
        return split.reasoning, split.content, []
    result = GptOssToolParser().extract(split.content or "")
    assert result.tools_called == bool(result.tool_calls)
    assert all(TOOL_ID_RE.fullmatch(c.id) and c.type == "function" for c in result.tool_calls)
    return split.reasoning, result.content, [(c.name, c.arguments) for c in result.tool_calls]


def our_stream(deltas: list[str], tools: bool) -> Assembled:
    reasoning = GptOssReasoningParser(pass_tool_calls=tools)
    calls, out = GptOssToolParser(), Assembled()
    assert reasoning.reasoning_ended  # as vLLM's: every delta's content goes to the tool parser
    for msg in [*(reasoning.feed(d) for d in deltas), reasoning.finish()]:
        if msg is None:
            continue
        out.add(msg.reasoning, None if tools else msg.content, [])
        if tools and msg.content:
            _add_tool_delta(out, calls.feed(msg.content))
    if tools:
        _add_tool_delta(out, calls.finish())
    return out


def _add_tool_delta(out: Assembled, msg: Any) -> None:
    if msg is not None:
        calls = [(c.index, c.id, c.name, c.arguments) for c in msg.tool_calls]
        out.add(None, msg.content, calls)


_MARKER_RE = re.compile(r"<\|[a-z_0-9]+\|>")


def two_delta_splits(text: str) -> list[list[str]]:
    """Every split into two deltas, except inside a marker: a marker is one special token, which
    vLLM's harmony parser recognises by id; cut in two it is two ordinary tokens, which a
    text-only parser cannot tell from the marker (and a real stream never sends)."""
    inside = {i for m in _MARKER_RE.finditer(text) for i in range(m.start() + 1, m.end())}
    return [[text[:i], text[i:]] for i in range(1, len(text)) if i not in inside]


ANALYSIS = "<|channel|>analysis<|message|>The user wants the weather in Paris.<|end|>"
CALL_HEADER = (
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
)
PARIS = CALL_HEADER + '{"city": "Paris"}<|call|>'
TOKYO = CALL_HEADER + '{"city": "Tōkyō 東京 🙂"}<|call|>'
FINAL = "<|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>"
SAMPLES = {
    "analysis_only": ANALYSIS,
    "analysis_cut_off": "<|channel|>analysis<|message|>The user wants",
    "analysis_then_final": ANALYSIS + FINAL,
    # The detokenized text leaves out the stop token that ended generation.
    "final_without_stop_text": ANALYSIS + FINAL.removesuffix("<|return|>"),
    "final_only": "<|channel|>final<|message|>Hello! How can I help?<|return|>",
    "analysis_then_call": ANALYSIS + PARIS,
    "call_without_stop_text": ANALYSIS + PARIS.removesuffix("<|call|>"),
    "recipient_in_role_header": ANALYSIS
    + "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{}",
    "preamble_then_call": "<|channel|>commentary<|message|>Checking the weather.<|end|>" + PARIS,
    "whitespace_preamble": "<|channel|>commentary<|message|> <|end|>" + PARIS,
    "several_calls": ANALYSIS + PARIS + TOKYO,
    "call_cut_off_mid_arguments": ANALYSIS + CALL_HEADER + '{"city": "Par',
    "call_cut_off_in_header": ANALYSIS
    + "<|start|>assistant<|channel|>commentary to=functions.get_wea",
    "cut_off_in_first_header": "<|channel|>analy",
    "bare_function_name": "<|channel|>commentary to=get_weather<|message|>{}<|call|>",
    "non_json_content_type": "<|channel|>commentary to=functions.get_weather code<|message|>x=1",
    "invalid_json_arguments": CALL_HEADER + '{"city": Paris}<|call|>',
    "builtin_tools": "<|channel|>analysis to=python code<|message|>print(1)<|call|><|start|>"
    'assistant<|channel|>commentary to=browser.search json<|message|>{"q": "x"}<|call|>',
    "header_rejected": "<|channel|>final a b c<|message|>dropped<|end|>" + FINAL,
    "text_between_messages": ANALYSIS + "stray" + FINAL,
    "two_finals": "<|channel|>final<|message|>a<|end|>" + FINAL,
    "markers_inside_content": "<|channel|>final<|message|>a<|start|>b<|channel|>c",
    "other_role": "<|channel|>final<|message|>a<|end|><|start|>user<|channel|>final<|message|>b",
    "not_harmony": "Just plain text.",
    "unicode": "<|channel|>analysis<|message|>Prüfe 東京…<|end|>" + TOKYO,
}


@pytest.mark.parametrize("sample", SAMPLES)
@pytest.mark.parametrize("tools", [True, False], ids=["with_openai", "reasoning_only"])
def test_whole_output_matches_vllm(sample: str, tools: bool) -> None:
    text = SAMPLES[sample]
    assert our_whole(text, tools) == vllm_whole(text, tools)


@pytest.mark.parametrize("sample", SAMPLES)
@pytest.mark.parametrize("tools", [True, False], ids=["with_openai", "reasoning_only"])
def test_streaming_matches_vllm(sample: str, tools: bool) -> None:
    text = SAMPLES[sample]
    for deltas in [token_deltas(text, _tok()), [text], *two_delta_splits(text)]:
        assert our_stream(deltas, tools).comparable() == vllm_stream(deltas, tools).comparable()


@pytest.mark.parametrize("sample", SAMPLES)
def test_default_reasoning_parser_alone(sample: str) -> None:
    """Registered as is, the reasoning parser passes calls on for the tool parser; with no call in
    the output it gives what vLLM gives without a tool parser."""
    text = SAMPLES[sample]
    if not vllm_whole(text, tools=True)[2]:
        expected = ReasoningResult(*vllm_whole(text, tools=False)[:2])
        assert reasoning_parser("openai_gptoss").extract(text) == expected


def test_calls_are_passed_on_as_harmony_text() -> None:
    assert reasoning_parser("openai_gptoss").extract(ANALYSIS + PARIS) == ReasoningResult(
        "The user wants the weather in Paris.", PARIS
    )
    # A recipient in the role header comes out in the usual order, with what harmony read.
    call = '<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{"a": 1}'
    passed_on = '<|start|>assistant<|channel|>commentary to=functions.f json<|message|>{"a": 1}'
    content = reasoning_parser("openai_gptoss").extract(ANALYSIS + call).content
    assert content == passed_on + "<|call|>"


def test_streamed_call_pieces() -> None:
    parser = tool_parser("openai")
    first = parser.feed("Hi " + CALL_HEADER)
    assert first is not None and first.content == "Hi "
    (head,) = first.tool_calls
    # As vLLM: the name goes out with the header, arguments "" until their text comes.
    assert (head.index, head.type, head.name, head.arguments) == (0, "function", "get_weather", "")
    assert TOOL_ID_RE.fullmatch(head.id or "")
    last = parser.feed('{"city": "Paris"}<|call|>')
    assert last is not None and last.content is None
    assert [(c.index, c.id, c.arguments) for c in last.tool_calls] == [
        (0, None, '{"city": "Paris"}')
    ]
    assert parser.finish() is None


def test_tool_parser_on_plain_text() -> None:
    result = tool_parser("openai").extract("The answer is 4 < 5.")
    assert (result.tools_called, result.tool_calls, result.content) == (
        False,
        [],
        "The answer is 4 < 5.",
    )


_PIECES = [
    *("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>"),
    *("<|constrain|>", "assistant", "user", "analysis", "final", "commentary", " ", "\n"),
    *(" to=functions.get_weather", " to=python", " to=browser.search", " to=get_weather", "to="),
    *(" json", "code", "hi", "東京🙂", '{"city": "Paris"}', '{"a":', "x y", "\u3000", "<"),
]


def _random_output(rng: random.Random) -> str:
    """Harmony-like output: mostly message-shaped runs of markers and words, some pure noise."""
    if rng.random() < 0.3:
        return "".join(rng.choice(_PIECES) for _ in range(rng.randint(1, 12)))
    out: list[str] = []
    for k in range(rng.randint(1, 5)):
        if k or rng.random() < 0.2:
            out.append("<|start|>" if rng.random() < 0.9 else rng.choice(_PIECES))
        out += rng.choices(_PIECES[6:], k=rng.randint(0, 4))
        if rng.random() < 0.9:
            out.append("<|message|>")
        out += rng.choices(_PIECES, k=rng.randint(0, 4))
        if rng.random() < 0.8:
            out.append(rng.choice(["<|end|>", "<|call|>", "<|return|>"]))
    return "".join(out)


@pytest.mark.parametrize("seed", range(4))
def test_random_outputs_match_vllm(seed: int) -> None:
    """Headers harmony rejects, markers in odd places, cut-offs: the corners samples miss."""
    rng = random.Random(seed)
    for _ in range(50):
        text = _random_output(rng)
        for tools in (True, False):
            assert our_whole(text, tools) == vllm_whole(text, tools), text
            for deltas in [token_deltas(text, _tok()), [text]]:
                ours, theirs = our_stream(deltas, tools), vllm_stream(deltas, tools)
                assert ours.comparable() == theirs.comparable(), deltas
