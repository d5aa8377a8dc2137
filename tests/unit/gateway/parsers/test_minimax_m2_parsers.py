"""minimax_m2 reasoning parser against vLLM 0.32's, whole and streamed.

MiniMax M2's ``<think>``, ``</think>``, ``<minimax:tool_call>`` and ``</minimax:tool_call>`` are
added tokens that are not special in its tokenizer, so they are plain added tokens here; the
test tokenizer's own special tokens (``<|im_end|>``, ``<|endoftext|>``) go to our parser, as
vLLM drops special tokens its grammar does not know.
"""

from __future__ import annotations

import pytest

from gateway.parsers import ReasoningResult, reasoning_parser
from gateway.parsers.minimax_m2_reasoning import MARKERS, MiniMaxM2ReasoningParser
from tests.unit.gateway.parsers.vllm_reference import (
    our_stream,
    token_deltas,
    tokenizer,
    two_delta_splits,
    vllm_prompt_ends_reasoning,
    vllm_stream,
    vllm_whole,
)

TOK = tokenizer(MARKERS)
SPECIAL = tuple(TOK.all_special_tokens)
CALL = (
    '<minimax:tool_call><invoke name="get_weather">\n'
    '<parameter name="city">Paris</parameter>\n</invoke></minimax:tool_call>'
)
SAMPLES = {
    "reasoning_then_answer": "Let me think.\n</think>\n\nThe answer is 4.",
    "with_start_tag": "<think>\nLet me think.</think>The answer is 4.",
    "never_closed": "Let me think, and think again  \n",
    "reasoning_then_tool_call": f"Call the tool.</think>\n\n{CALL}",
    "tool_call_inside_reasoning": f"Call the tool.{CALL}",
    "empty_reasoning": "</think>Answer",
    "second_end_tag": "a</think>b</think>c",
    "second_start_tag": "a<think>b</think>c",
    "stray_tool_call_end": "a</think>b</minimax:tool_call>c",
    "unicode": "考虑一下 é 🙂</think>答案：✓ naïve",
    "tool_markup_as_text": (
        "a < b > c <invoke name=x> '>\"> </think>x <invoke name='y'> > <think> y </parameter>"
    ),
    # Streamed, held-back text is flushed without the whitespace before it (as in vLLM).
    "ends_in_marker_prefix": "abc \n<",
    "ends_in_invoke_prefix": "abc <invoke name=",
    "other_special_tokens": "a<|im_end|>b</think>c<|im_end|>d <|endoftext|",
}


@pytest.mark.parametrize("sample", SAMPLES)
def test_whole_output_matches_vllm(sample: str) -> None:
    text = SAMPLES[sample]
    reasoning, content, _ = vllm_whole(text, reasoning="minimax_m2", tok=TOK)
    parser = MiniMaxM2ReasoningParser(special_tokens=SPECIAL)
    assert parser.extract(text) == ReasoningResult(reasoning, content)


@pytest.mark.parametrize("sample", SAMPLES)
def test_streaming_matches_vllm(sample: str) -> None:
    # Splits that cut a marker are included: both sides read it as plain text.
    text = SAMPLES[sample]
    for deltas in [token_deltas(text, TOK), [text], *two_delta_splits(text)]:
        ours = our_stream(MiniMaxM2ReasoningParser(special_tokens=SPECIAL), deltas)
        expected = vllm_stream(deltas, reasoning="minimax_m2", tok=TOK)
        assert ours.comparable() == expected.comparable(), deltas


def test_registry_parser_opens_in_reasoning() -> None:
    parser = reasoning_parser("minimax_m2")
    assert not parser.reasoning_ended
    first = parser.feed("a")
    assert first is not None and first.reasoning == "a"
    end = parser.feed("</think>b")
    assert end is not None and (end.reasoning, end.content) == (None, "b")
    assert parser.reasoning_ended
    assert parser.feed("</think>") is not None  # later deltas pass through raw


@pytest.mark.parametrize(
    "prompt",
    ["<|im_start|>assistant\n", "a</think>b", "</think><think>", "<minimax:tool_call>x"],
)
def test_prompt_ends_reasoning_matches_vllm(prompt: str) -> None:
    expected, tokens = vllm_prompt_ends_reasoning(prompt, reasoning="minimax_m2", tok=TOK)
    assert MiniMaxM2ReasoningParser().prompt_ends_reasoning(tokens) == expected
