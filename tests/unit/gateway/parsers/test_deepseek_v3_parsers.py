"""deepseek_v31 tool and deepseek_v3 reasoning parsers against vLLM 0.32's, whole and streamed.

DeepSeek V3.x's tool markers and ``<think>``/``</think>`` are added tokens that are not special
in its tokenizer, so they are plain added tokens here too.
"""

from __future__ import annotations

import pytest

from gateway.parsers import (
    DeltaMessage,
    ParserContext,
    ReasoningResult,
    reasoning_parser,
    tool_parser,
)
from gateway.parsers.deepseek_v3_reasoning import DeepSeekV3ReasoningParser
from gateway.parsers.deepseek_v31_tool import MARKERS, DeepSeekV31ToolParser
from tests.unit.gateway.parsers.vllm_reference import (
    TOOL_ID_RE,
    our_stream,
    token_deltas,
    tokenizer,
    two_delta_splits,
    vllm_prompt_ends_reasoning,
    vllm_stream_kwargs,
    vllm_whole_with_ids,
)

TOK = tokenizer((*MARKERS, "<think>", "</think>"))
CALLS, CALLS_END, CALL, CALL_END, SEP = MARKERS
PARIS = f'{CALL}get_weather{SEP}{{"city": "Paris"}}{CALL_END}'
TOKYO = f'{CALL}get_weather{SEP}{{"city": "Tōkyō 東京 🙂"}}{CALL_END}'
TOOL_SAMPLES = {
    "single_call": f"{CALLS}{PARIS}{CALLS_END}",
    "parallel_calls": f"{CALLS}{PARIS}{TOKYO}{CALLS_END}",
    "parallel_calls_on_lines": f"{CALLS}{PARIS}\n{TOKYO}{CALLS_END}",
    "text_before_call": f"Let me check.\n{CALLS}{PARIS}{CALLS_END}",
    "text_after_calls": f"{CALLS}{PARIS}{CALLS_END}\nDone.",
    # vLLM streams what it has but returns no call for the whole output.
    "cut_off_mid_arguments": f'{CALLS}{CALL}get_weather{SEP}{{"city": "Par',
    "cut_off_in_name": f"{CALLS}{CALL}get_wea",
    "no_calls_end": f"{CALLS}{PARIS}",
    # No DOTALL in vLLM's regexes: arguments on several lines are no call, streamed up to "\n".
    "multiline_arguments": (
        f'{CALLS}{CALL}get_weather{SEP}{{\n"city": "Paris"\n}}{CALL_END}{CALLS_END}'
    ),
    "number_argument": f'{CALLS}{CALL}get_weather{SEP}{{"days": 3}}{CALL_END}{CALLS_END}',
    "nested_arguments": f'{CALLS}{CALL}f{SEP}{{"a": {{"b": "c"}}, "d": "e"}}{CALL_END}{CALLS_END}',
    "not_json": f"{CALLS}{CALL}get_weather{SEP}not json{CALL_END}{CALLS_END}",
    "no_separator": f"{CALLS}{CALL}get_weather{CALL_END}{CALLS_END}",
    "no_call": "The answer is 4 < 5.",
    "unicode_text_before": f"Prüfe 東京…\n{CALLS}{TOKYO}{CALLS_END}",
}
REASONING_SAMPLES = {
    "reasoning_then_answer": "<think>\nLet me think.\n</think>\n\nThe answer is 4.",
    "no_start_tag": "Let me think.</think>ok",
    "never_closed": "<think>Let me think",
    "no_reasoning": "The answer is 4.",
    "reasoning_then_call": f"<think>a</think>{CALLS}{PARIS}{CALLS_END}",
    "second_end_tag": "<think>a</think>b</think>c",
}
THINKING = {
    "default": None,
    "thinking": {"thinking": True},
    "enable_thinking": {"enable_thinking": True},
    "thinking_off": {"thinking": False},
}


@pytest.mark.parametrize("sample", TOOL_SAMPLES)
def test_tool_whole_output_matches_vllm(sample: str) -> None:
    text = TOOL_SAMPLES[sample]
    _, content, calls = vllm_whole_with_ids(text, tool="deepseek_v31", tok=TOK)
    result = tool_parser("deepseek_v31").extract(text)
    assert result.tools_called == bool(calls)
    assert result.content == content
    assert [(c.name, c.arguments) for c in result.tool_calls] == [c[1:] for c in calls]
    assert all(TOOL_ID_RE.fullmatch(c.id) and c.type == "function" for c in result.tool_calls)


@pytest.mark.parametrize("sample", TOOL_SAMPLES)
def test_tool_streaming_matches_vllm(sample: str) -> None:
    # Splits that cut a marker are included: vLLM counts marker tokens, and ours counts the
    # markers one delta holds, which is the same thing.
    text = TOOL_SAMPLES[sample]
    for deltas in [token_deltas(text, TOK), [text], *two_delta_splits(text)]:
        ours = our_stream(DeepSeekV31ToolParser(), deltas)
        expected = vllm_stream_kwargs(deltas, tool="deepseek_v31", tok=TOK)
        assert ours.comparable() == expected.comparable(), deltas


@pytest.mark.parametrize("variant", THINKING)
@pytest.mark.parametrize("sample", REASONING_SAMPLES)
def test_reasoning_matches_vllm(sample: str, variant: str) -> None:
    text, kwargs = REASONING_SAMPLES[sample], THINKING[variant]
    expected = vllm_whole_with_ids(
        text, reasoning="deepseek_v3", tok=TOK, chat_template_kwargs=kwargs
    )
    assert DeepSeekV3ReasoningParser(**(kwargs or {})).extract(text) == ReasoningResult(
        *expected[:2]
    )
    for deltas in [token_deltas(text, TOK), [text], *two_delta_splits(text)]:
        ours = our_stream(DeepSeekV3ReasoningParser(**(kwargs or {})), deltas)
        theirs = vllm_stream_kwargs(
            deltas, reasoning="deepseek_v3", tok=TOK, chat_template_kwargs=kwargs
        )
        assert ours.comparable() == theirs.comparable(), deltas


def test_streamed_call_pieces() -> None:
    parser = tool_parser("deepseek_v31")
    assert parser.feed("Hi ") == DeltaMessage(content="Hi ")
    assert parser.feed(CALLS) is not None
    assert parser.feed(CALL) is None  # the call-start token alone: nothing to parse yet
    head = parser.feed(f"get_weather{SEP}")
    assert head is not None
    (piece,) = head.tool_calls
    assert (piece.index, piece.type, piece.name) == (0, "function", "get_weather")
    assert TOOL_ID_RE.fullmatch(piece.id or "")
    args = parser.feed('{"city": "Pa')
    assert args is not None and [c.arguments for c in args.tool_calls] == ['{"city": "Pa']
    closing = parser.feed(f'ris"}}{CALL_END}')
    assert closing is not None and [c.arguments for c in closing.tool_calls] == ['ris"}']
    assert parser.finish() is None


def test_deepseek_v3_defaults_to_no_reasoning() -> None:
    parser = reasoning_parser("deepseek_v3")
    assert parser.reasoning_ended
    assert parser.extract("<think>a</think>b") == ReasoningResult(None, "<think>a</think>b")
    thinking = DeepSeekV3ReasoningParser(enable_thinking=True)
    assert thinking.extract("<think>a</think>b") == ReasoningResult("a", "b")


@pytest.mark.parametrize("variant", ["default", "thinking"])
@pytest.mark.parametrize("prompt", ["<｜Assistant｜>", "<｜Assistant｜><think>", "a</think>"])
def test_prompt_ends_reasoning_matches_vllm(prompt: str, variant: str) -> None:
    kwargs = THINKING[variant]
    expected, tokens = vllm_prompt_ends_reasoning(
        prompt, reasoning="deepseek_v3", tok=TOK, chat_template_kwargs=kwargs
    )
    parser = DeepSeekV3ReasoningParser.for_request(ParserContext(chat_template_kwargs=kwargs or {}))
    assert parser.prompt_ends_reasoning(tokens) == expected
