"""qwen3 and deepseek_r1 reasoning parsers against vLLM 0.32's, whole and streamed."""

from __future__ import annotations

import pytest

from gateway.parsers import ReasoningResult, reasoning_parser
from tests.unit.gateway.parsers.vllm_reference import (
    our_stream,
    token_deltas,
    tokenizer,
    two_delta_splits,
    vllm_stream,
    vllm_whole,
)

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
SAMPLES = {
    "reasoning_then_answer": "<think>\nLet me think.\n</think>\n\nThe answer is 4.",
    "no_start_tag": "Let me think.</think>\n\nThe answer is 4.",
    "never_closed": "<think>Let me think, and think again",
    "no_reasoning": "The answer is 4.",
    "reasoning_then_tool_call": f"<think>Call the tool.</think>\n\n{CALL}",
    "tool_call_inside_reasoning": f"<think>Call the tool.{CALL}",
    "empty_reasoning": "<think></think>Answer",
    "second_end_tag": "<think>a</think>b</think>c",
    "second_start_tag": "<think>a<think>b</think>c",
    "text_before_start": "hmm<think>a</think>b",
    "unicode": "<think>考虑一下 é 🙂</think>答案：✓ naïve",
    "angle_brackets": "<think>a < b and <thin ice</think>x <think> y",
}
PARSERS = ("qwen3", "deepseek_r1")


@pytest.mark.parametrize("name", PARSERS)
@pytest.mark.parametrize("sample", SAMPLES)
def test_whole_output_matches_vllm(name: str, sample: str) -> None:
    text = SAMPLES[sample]
    reasoning, content, _ = vllm_whole(text, reasoning=name)
    assert reasoning_parser(name).extract(text) == ReasoningResult(reasoning, content)


@pytest.mark.parametrize("name", PARSERS)
@pytest.mark.parametrize("sample", SAMPLES)
def test_streaming_matches_vllm(name: str, sample: str) -> None:
    text = SAMPLES[sample]
    # Splits that cut a marker are included: both sides then read it as plain text (vLLM
    # matches markers by token id; a real stream never cuts one, a marker being one token).
    for deltas in [token_deltas(text), [text], *two_delta_splits(text)]:
        ours = our_stream(reasoning_parser(name), deltas)
        assert ours.comparable() == vllm_stream(deltas, reasoning=name).comparable(), deltas


def test_qwen3_defaults() -> None:
    parser = reasoning_parser("qwen3")
    assert parser.extract("plain") == ReasoningResult("plain", None)
    assert parser.extract("<think></think>") == ReasoningResult(None, None)
    assert parser.extract("<think>a</think>b</think>c") == ReasoningResult("a", "bc")


def test_deepseek_r1_start_tag_with_text_is_reasoning_in_one_delta() -> None:
    # vLLM quirk kept: a delta "<think>x" (start token plus more) is sent whole as reasoning.
    parser = reasoning_parser("deepseek_r1")
    first = parser.feed("<think>x")
    assert first is not None and first.reasoning == "<think>x"
    second = parser.feed("y</think>z")
    assert second is not None and (second.reasoning, second.content) == ("y", "z")
    assert parser.reasoning_ended


def test_streaming_after_end_is_raw_content() -> None:
    parser = reasoning_parser("qwen3")
    assert parser.feed("a</think>") is not None
    later = parser.feed("b</think><think>")
    assert later is not None and later.content == "b</think><think>"


COUNT_SAMPLES = [
    "<think>abc def</think>\n\nhello world",
    "<think>abc def",
    "hello</think>x",
    "a<think>b</think>c<tool_call>d",
    "plain text here",
    "<tool_call>x",
    "x<|endoftext|>",
    "<think>a</think>b</think>c",
]


@pytest.mark.parametrize("name", PARSERS)
@pytest.mark.parametrize("text", COUNT_SAMPLES)
@pytest.mark.parametrize("eos", [False, True])
def test_reasoning_token_count_matches_vllm(name: str, text: str, eos: bool) -> None:
    from vllm.parser.parser_manager import ParserManager

    tok = tokenizer(special=("<|endoftext|>",))
    ids = tok.encode(text, add_special_tokens=False)
    if eos:
        ids.append(tok.convert_tokens_to_ids("<|im_end|>"))
    cls = ParserManager.get_parser(reasoning_parser_name=name, tool_parser_name=None)
    expected = cls(tok, None).count_reasoning_tokens(ids)
    texts = [tok.decode([i]) for i in ids]
    specials = set(tok.all_special_tokens)
    assert reasoning_parser(name).count_reasoning_tokens(texts, specials) == expected
