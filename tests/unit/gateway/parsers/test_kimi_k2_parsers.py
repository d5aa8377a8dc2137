"""kimi_k2 tool and reasoning parsers against vLLM 0.32's, whole and streamed, alone and chained.

Kimi's markers are special tokens in its tokenizer, so they are special here too, and the
tokenizer's special tokens go to our parsers (vLLM drops the ones its grammar does not know).
"""

from __future__ import annotations

import pytest

from gateway.parsers import (
    ParserContext,
    reasoning_parser,
    tool_parser,
)
from gateway.parsers.kimi_k2_reasoning import KimiK2ReasoningParser
from gateway.parsers.kimi_k2_tool import MARKERS, KimiK2ToolParser
from tests.unit.gateway.parsers.vllm_reference import (
    TOOL_ID_RE,
    TOOLS,
    Assembled,
    ReasoningThenTools,
    our_stream,
    token_deltas,
    tokenizer,
    two_delta_splits,
    vllm_prompt_ends_reasoning,
    vllm_stream_kwargs,
    vllm_whole_with_ids,
)

TOK = tokenizer((), MARKERS)
SPECIAL = tuple(TOK.all_special_tokens)
SECTION, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL, CALL_END, ARGS = "<|tool_call_begin|>", "<|tool_call_end|>", "<|tool_call_argument_begin|>"
PARIS = f'{CALL}functions.get_weather:0{ARGS}{{"city": "Paris"}}{CALL_END}'
TOKYO = f'{CALL}functions.get_weather:1{ARGS}{{"city": "Tōkyō 東京 🙂"}}{CALL_END}'
TOOL_SAMPLES = {
    "single_call": f"{SECTION}{PARIS}{SECTION_END}",
    "parallel_calls": f"{SECTION}\n{PARIS}\n{TOKYO}\n{SECTION_END}",
    "text_before_call": f"Let me check.\n{SECTION}{PARIS}{SECTION_END}",
    "text_after_section": f"{SECTION}{PARIS}{SECTION_END}\nDone.",
    "cut_off_mid_arguments": f'{SECTION}{CALL}functions.get_weather:0{ARGS}{{"city": "Par',
    "cut_off_in_name": f"{SECTION}{CALL}functions.get_wea",
    "no_section_end": f"{SECTION}{PARIS}",
    "header_without_index": f'{SECTION}{CALL}get_weather{ARGS}{{"city": "Paris"}}{CALL_END}',
    # Whole outputs coerce the number to the schema's string; streams send the raw text.
    "spaced_header_and_arguments": (
        f'{SECTION}{CALL} functions.get_weather:0 {ARGS} {{"city": 42}} {CALL_END}{SECTION_END}'
    ),
    "invalid_json": f'{SECTION}{CALL}functions.get_weather:0{ARGS}{{"city": "Paris"{CALL_END}',
    "empty_arguments": f"{SECTION}{CALL}functions.get_weather:0{ARGS}{CALL_END}{SECTION_END}",
    "whitespace_before_section": f"\n\n{SECTION}{PARIS}{SECTION_END}",
    "think_tags_in_content": f"<think>hm</think>ok{SECTION}{PARIS}{SECTION_END}",
    "stray_call_end": f"a{CALL_END}b",
    "no_call": "The answer is 4 < 5.",
    "unicode_text_before": f"Prüfe 東京…\n{SECTION}{TOKYO}{SECTION_END}",
}
REASONING_SAMPLES = {
    "reasoning_then_answer": "<think>\nLet me think.\n</think>\n\nThe answer is 4.",
    "no_start_tag": "Let me think.</think>\n\nThe answer is 4.",
    "never_closed": "<think>Let me think, and think again  \n",
    "no_reasoning": "The answer is 4.",
    "reasoning_then_call": f"<think>Call the tool.</think>\n\n{SECTION}{PARIS}{SECTION_END}",
    "call_inside_reasoning": f"<think>Call the tool.{SECTION}{PARIS}{SECTION_END}",
    "empty_reasoning": "<think></think>Answer",
    "second_end_tag": "<think>a</think>b</think>c",
    "second_start_tag": "<think>a<think>b</think>c",
    "text_before_start": "hmm<think>a</think>b",
    "unicode": "<think>考虑一下 é 🙂</think>答案：✓ naïve",
    "angle_brackets": "<think>a < b and <thin ice</think>x <think> y",
    "trailing_whitespace": "<think>a \n </think>  b",
    # Streamed, the held-back "<" is flushed without the whitespace before it (as in vLLM).
    "ends_in_marker_prefix": "<think>abc \n<",
    "other_special_tokens": "<think>a<|im_end|>b</think>c<|endoftext|>",
}
THINKING = {
    "default": {},
    "thinking_off": {"thinking": False},
    "enable_thinking_wins": {"thinking": False, "enable_thinking": True},
}
# Streams are compared for every sample with vLLM's defaults, and with thinking off for the
# samples where it changes something (streaming all variants of all samples takes too long).
TOOL_STREAMS = [(s, "default") for s in TOOL_SAMPLES] + [
    ("think_tags_in_content", "thinking_off"),
    ("whitespace_before_section", "thinking_off"),
]
REASONING_STREAMS = [(s, "default") for s in REASONING_SAMPLES] + [
    ("reasoning_then_call", "thinking_off"),
    ("other_special_tokens", "thinking_off"),
    ("no_start_tag", "enable_thinking_wins"),
]


def _comparable(out: Assembled) -> tuple:
    # Kimi's ids come from the text and must be equal; vLLM's random ones only share a format.
    assert set(out.ids) == set(out.calls), (out.ids, out.calls)
    ids = {i: "<random>" if TOOL_ID_RE.fullmatch(v) else v for i, v in out.ids.items()}
    return out.reasoning, out.content, out.calls, ids


def _all_deltas(text: str) -> list[list[str]]:
    return [token_deltas(text, TOK), [text], *two_delta_splits(text)]


def _tools(**kwargs) -> KimiK2ToolParser:
    return KimiK2ToolParser(tools=TOOLS, special_tokens=SPECIAL, **kwargs)


def _reasoning(**kwargs) -> KimiK2ReasoningParser:
    return KimiK2ReasoningParser(special_tokens=SPECIAL, **kwargs)


@pytest.mark.parametrize("kwargs", THINKING.values(), ids=THINKING)
@pytest.mark.parametrize("sample", TOOL_SAMPLES)
def test_tool_whole_output_matches_vllm(sample: str, kwargs: dict) -> None:
    text = TOOL_SAMPLES[sample]
    _, content, calls = vllm_whole_with_ids(
        text, tool="kimi_k2", tok=TOK, chat_template_kwargs=kwargs
    )
    result = _tools(**kwargs).extract(text)
    assert result.tools_called == bool(calls)
    assert result.content == content
    ours = [(c.id, c.name, c.arguments) for c in result.tool_calls]
    assert [c[1:] for c in ours] == [c[1:] for c in calls]
    for (our_id, *_), (vllm_id, *_) in zip(ours, calls, strict=True):
        assert our_id == vllm_id or TOOL_ID_RE.fullmatch(our_id) and TOOL_ID_RE.fullmatch(vllm_id)


@pytest.mark.parametrize(("sample", "variant"), TOOL_STREAMS)
def test_tool_streaming_matches_vllm(sample: str, variant: str) -> None:
    kwargs = THINKING[variant]
    for deltas in _all_deltas(TOOL_SAMPLES[sample]):
        ours = our_stream(_tools(**kwargs), deltas)
        expected = vllm_stream_kwargs(deltas, tool="kimi_k2", tok=TOK, chat_template_kwargs=kwargs)
        assert _comparable(ours) == _comparable(expected), deltas


@pytest.mark.parametrize("kwargs", THINKING.values(), ids=THINKING)
@pytest.mark.parametrize("sample", REASONING_SAMPLES)
def test_reasoning_whole_output_matches_vllm(sample: str, kwargs: dict) -> None:
    text = REASONING_SAMPLES[sample]
    expected = vllm_whole_with_ids(text, reasoning="kimi_k2", tok=TOK, chat_template_kwargs=kwargs)
    result = _reasoning(**kwargs).extract(text)
    assert (result.reasoning, result.content) == expected[:2]


@pytest.mark.parametrize(("sample", "variant"), REASONING_STREAMS)
def test_reasoning_streaming_matches_vllm(sample: str, variant: str) -> None:
    kwargs = THINKING[variant]
    # Splits that cut a marker are included: both sides read it as plain text.
    for deltas in _all_deltas(REASONING_SAMPLES[sample]):
        ours = our_stream(_reasoning(**kwargs), deltas)
        expected = vllm_stream_kwargs(
            deltas, reasoning="kimi_k2", tok=TOK, chat_template_kwargs=kwargs
        )
        assert _comparable(ours) == _comparable(expected), deltas


CHAINED = [
    f"<think>Call it.</think>\n\n{SECTION}{PARIS}{SECTION_END}",
    f"<think>Call it.{SECTION}{PARIS}{SECTION_END}",
    f"<think>a</think>b</think>c{SECTION}{PARIS}{SECTION_END}x",
    f"<think>a \n</think> \n{SECTION}{PARIS}{SECTION_END}",
    f"{SECTION}{PARIS}{SECTION_END}",
]


@pytest.mark.parametrize(
    ("text", "variant"),
    [(t, "default") for t in CHAINED]
    + [(CHAINED[0], "thinking_off"), (CHAINED[2], "thinking_off")],
)
def test_reasoning_then_tools_matches_vllm(text: str, variant: str) -> None:
    kwargs = THINKING[variant]
    reasoning, content, calls = vllm_whole_with_ids(
        text, tool="kimi_k2", reasoning="kimi_k2", tok=TOK, chat_template_kwargs=kwargs
    )
    split = _reasoning(**kwargs).extract(text)
    result = _tools(after_reasoning_parser=True, **kwargs).extract(split.content or "")
    assert (split.reasoning, result.content) == (reasoning, content)
    assert [(c.id, c.name, c.arguments) for c in result.tool_calls] == calls
    for deltas in _all_deltas(text):
        pipeline = ReasoningThenTools(
            _reasoning(**kwargs), _tools(after_reasoning_parser=True, **kwargs)
        )
        expected = vllm_stream_kwargs(
            deltas, tool="kimi_k2", reasoning="kimi_k2", tok=TOK, chat_template_kwargs=kwargs
        )
        assert _comparable(pipeline.run(deltas)) == _comparable(expected), deltas


def test_call_ids_come_from_the_text() -> None:
    result = tool_parser("kimi_k2").extract(TOOL_SAMPLES["parallel_calls"])
    assert [(c.id, c.name) for c in result.tool_calls] == [
        ("functions.get_weather:0", "get_weather"),
        ("functions.get_weather:1", "get_weather"),
    ]
    parser = tool_parser("kimi_k2")
    first = parser.feed(f"{SECTION}{CALL}functions.get_weather:7{ARGS}{{")
    assert first is not None
    (piece,) = first.tool_calls
    assert (piece.id, piece.type, piece.name, piece.arguments) == (
        "functions.get_weather:7",
        "function",
        "get_weather",
        "{",
    )
    last = parser.feed(f'"city": "Paris"}}{CALL_END}')
    assert last is not None and [c.arguments for c in last.tool_calls] == ['"city": "Paris"}']
    assert parser.finish() is None


def test_registry_defaults_are_vllms() -> None:
    # Thinking is on by default: output opens in reasoning.
    parser = reasoning_parser("kimi_k2")
    assert parser.extract("a</think>b").reasoning == "a"
    assert not parser.reasoning_ended
    assert KimiK2ReasoningParser(thinking=False).reasoning_ended
    assert tool_parser("kimi_k2").name == "kimi_k2"


PROMPTS = [
    "<|im_start|>assistant\n",
    "<|im_start|>assistant\n<think>",
    "<think>a</think>b<|im_start|>assistant\n",
    f"x{SECTION}y",
    "</think><think>",
]


@pytest.mark.parametrize("variant", ["default", "thinking_off"])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_prompt_ends_reasoning_matches_vllm(prompt: str, variant: str) -> None:
    kwargs = THINKING[variant]
    expected, tokens = vllm_prompt_ends_reasoning(
        prompt, reasoning="kimi_k2", tok=TOK, chat_template_kwargs=kwargs
    )
    assert (
        KimiK2ReasoningParser.for_request(
            ParserContext(chat_template_kwargs=kwargs)
        ).prompt_ends_reasoning(tokens)
        == expected
    )


def test_for_request_reads_thinking_kwargs() -> None:
    assert not KimiK2ReasoningParser.for_request(ParserContext()).reasoning_ended
    assert KimiK2ReasoningParser.for_request(
        ParserContext(chat_template_kwargs={"thinking": False})
    ).reasoning_ended
    both = {"thinking": False, "enable_thinking": True}
    assert not KimiK2ReasoningParser.for_request(
        ParserContext(chat_template_kwargs=both)
    ).reasoning_ended
    assert KimiK2ReasoningParser.keeps_special_tokens and KimiK2ToolParser.keeps_special_tokens
