"""gemma4 tool and reasoning parsers against vLLM 0.32's, whole and streamed, alone and chained.

Gemma 4's markers (``<|channel>``, ``<channel|>``, ``<|tool_call>``, ``<tool_call|>``, ``<|"|>``)
and ``<turn|>`` are special tokens in its tokenizer, so they are special here too, and the
tokenizer's special tokens go to our parsers (vLLM drops those its grammar does not know).
"""

from __future__ import annotations

import pytest

from gateway.parsers import (
    ParserContext,
    reasoning_parser,
    tool_parser,
)
from gateway.parsers.gemma4_reasoning import Gemma4ReasoningParser
from gateway.parsers.gemma4_tool import MARKERS, Gemma4ToolParser, gemma4_arg_converter
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

TOK = tokenizer((), (*MARKERS, "<turn|>", "<|turn>", "<|tool_response>"))
SPECIAL = tuple(TOK.all_special_tokens)
Q = '<|"|>'
PARIS = f"<|tool_call>call:get_weather{{city:{Q}Paris{Q}}}<tool_call|>"
TOKYO = (
    f"<|tool_call>call:get_weather{{city:{Q}Tōkyō 東京 🙂{Q},days:3,metric:true,"
    f"tags:[{Q}a{Q},{Q}b, c{Q}],opts:{{x:2.5}}}}<tool_call|>"
)
TYPED_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "metric": {"type": "boolean"},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "opts": {"type": "object", "properties": {"x": {"type": "number"}}},
                },
            },
        },
    }
]
TOOL_SAMPLES = {
    "single_call": PARIS,
    "parallel_calls": PARIS + TOKYO,
    "text_before_call": "Let me check.\n" + PARIS,
    "text_after_call": PARIS + "\nDone.",
    "cut_off_mid_arguments": f"<|tool_call>call:get_weather{{city:{Q}Par",
    "cut_off_in_name": "<|tool_call>call:get_wea",
    "no_end_tag": f"<|tool_call>call:get_weather{{city:{Q}Paris{Q}}}",
    "bare_colon_opener": f"<|tool_call>:get_weather{{city:{Q}Paris{Q}}}<tool_call|>",
    "parenthesised_arguments": f"<|tool_call>call:get_weather(city:{Q}Paris{Q})<tool_call|>",
    "ended_by_turn_token": f"<|tool_call>call:get_weather{{city:{Q}Paris{Q},days:12}}<turn|>",
    "bare_values": "<|tool_call>call:get_weather{days:108.25,metric:false}<tool_call|>",
    "no_arguments": "<|tool_call>call:get_weather{}<tool_call|>",
    "unknown_tool": f"<|tool_call>call:other{{a:1,b:{Q}x{Q}}}<tool_call|>",
    "channel_then_call": f"<|channel>thought\nhmm<channel|>ok{PARIS}",
    "implied_channel": "thought\nhmm<channel|>answer",
    "whitespace_before_call": "\n\n" + PARIS,
    "no_call": "The answer is 4 < 5: call: me {maybe}.",
    "unicode_text_before": "Prüfe 東京…\n" + TOKYO,
}
REASONING_SAMPLES = {
    "reasoning_then_answer": "<|channel>thought\nLet me think.<channel|>The answer is 4.",
    "no_start_tag": "thought\nLet me think.<channel|>The answer is 4.",
    "never_closed": "<|channel>thought\nLet me think",
    "no_reasoning": "The answer is 4.",
    "reasoning_then_call": f"<|channel>thought\nCall it.<channel|>{PARIS}",
    "call_inside_reasoning": f"<|channel>thought\nCall it.{PARIS}",
    "empty_reasoning": "<|channel>thought\n<channel|>Answer",
    "thought_without_newline": "<|channel>thought<channel|>Answer",
    "second_end_tag": "<|channel>a<channel|>b<channel|>c",
    "text_before_start": "hmm<|channel>thought\na<channel|>b",
    "unicode": "<|channel>thought\n考虑一下 é 🙂<channel|>答案：✓",
    "only_the_word_thought": "thought",
    "trailing_whitespace": "<|channel>thought\na  \n<channel|>  b",
}
THINKING = {"default": {}, "thinking": {"enable_thinking": True}}
# The schema only changes argument types, so streams with it cover the samples with values.
TOOL_STREAMS = [(s, "plain") for s in TOOL_SAMPLES] + [
    (s, "typed") for s in ("parallel_calls", "bare_values", "ended_by_turn_token")
]
SCHEMAS = {"plain": TOOLS, "typed": TYPED_TOOLS}


def _comparable(out: Assembled) -> tuple:
    assert set(out.ids) == set(out.calls), (out.ids, out.calls)
    assert all(TOOL_ID_RE.fullmatch(i) for i in out.ids.values()), out.ids
    return out.reasoning, out.content, out.calls


def _all_deltas(text: str) -> list[list[str]]:
    return [token_deltas(text, TOK), [text], *two_delta_splits(text)]


def _tools(**kwargs) -> Gemma4ToolParser:
    return Gemma4ToolParser(special_tokens=SPECIAL, **kwargs)


def _reasoning(**kwargs) -> Gemma4ReasoningParser:
    return Gemma4ReasoningParser(special_tokens=SPECIAL, **kwargs)


@pytest.mark.parametrize("schema", SCHEMAS)
@pytest.mark.parametrize("sample", TOOL_SAMPLES)
def test_tool_whole_output_matches_vllm(sample: str, schema: str) -> None:
    text, tools = TOOL_SAMPLES[sample], SCHEMAS[schema]
    _, content, calls = vllm_whole_with_ids(text, tool="gemma4", tok=TOK, tools=tools)
    result = _tools(tools=tools).extract(text)
    assert result.tools_called == bool(calls)
    assert result.content == content
    assert [(c.name, c.arguments) for c in result.tool_calls] == [c[1:] for c in calls]
    assert all(TOOL_ID_RE.fullmatch(c.id) and c.type == "function" for c in result.tool_calls)


@pytest.mark.parametrize(("sample", "schema"), TOOL_STREAMS)
def test_tool_streaming_matches_vllm(sample: str, schema: str) -> None:
    tools = SCHEMAS[schema]
    for deltas in _all_deltas(TOOL_SAMPLES[sample]):
        ours = our_stream(_tools(tools=tools), deltas)
        expected = vllm_stream_kwargs(deltas, tool="gemma4", tok=TOK, tools=tools)
        assert _comparable(ours) == _comparable(expected), deltas


@pytest.mark.parametrize("variant", THINKING)
@pytest.mark.parametrize("sample", REASONING_SAMPLES)
def test_reasoning_whole_output_matches_vllm(sample: str, variant: str) -> None:
    text, kwargs = REASONING_SAMPLES[sample], THINKING[variant]
    expected = vllm_whole_with_ids(text, reasoning="gemma4", tok=TOK, chat_template_kwargs=kwargs)
    result = _reasoning(**kwargs).extract(text)
    assert (result.reasoning, result.content) == expected[:2]


@pytest.mark.parametrize("variant", THINKING)
@pytest.mark.parametrize("sample", REASONING_SAMPLES)
def test_reasoning_streaming_matches_vllm(sample: str, variant: str) -> None:
    # Without enable_thinking vLLM streams everything as content; splits that cut a marker are
    # included: both sides read it as plain text.
    kwargs = THINKING[variant]
    for deltas in _all_deltas(REASONING_SAMPLES[sample]):
        ours = our_stream(_reasoning(**kwargs), deltas)
        expected = vllm_stream_kwargs(
            deltas, reasoning="gemma4", tok=TOK, chat_template_kwargs=kwargs
        )
        assert _comparable(ours) == _comparable(expected), deltas


def _cuts_marker(deltas: list[str]) -> bool:
    """Whether a two-delta split cuts a marker token in two."""
    if len(deltas) != 2:
        return False
    text, cut = "".join(deltas), len(deltas[0])
    for marker in MARKERS:
        start = text.find(marker)
        while start != -1:
            if start < cut < start + len(marker):
                return True
            start = text.find(marker, start + 1)
    return False


CHAINED = {
    name: REASONING_SAMPLES[name]
    for name in ("reasoning_then_call", "call_inside_reasoning", "reasoning_then_answer")
}


@pytest.mark.parametrize("variant", THINKING)
@pytest.mark.parametrize("sample", CHAINED)
def test_reasoning_then_tools_matches_vllm(sample: str, variant: str) -> None:
    text, kwargs = CHAINED[sample], THINKING[variant]
    reasoning, content, calls = vllm_whole_with_ids(
        text, tool="gemma4", reasoning="gemma4", tok=TOK, chat_template_kwargs=kwargs
    )
    split = _reasoning(**kwargs).extract(text)
    result = _tools(tools=TOOLS, after_reasoning_parser=True, **kwargs).extract(split.content or "")
    assert (split.reasoning, result.content) == (reasoning, content)
    assert [(c.name, c.arguments) for c in result.tool_calls] == [c[1:] for c in calls]
    for deltas in _all_deltas(text):
        # A split that cuts "<|channel>" before reasoning ends: vLLM hands the tool parser that
        # text together with token ids showing it was no token, so it stays content there. Our
        # tool parser gets text only and reads a whole "<|channel>" as the token. Real streams
        # never cut a token.
        if _cuts_marker(deltas):
            continue
        pipeline = ReasoningThenTools(
            _reasoning(**kwargs), _tools(tools=TOOLS, after_reasoning_parser=True, **kwargs)
        )
        expected = vllm_stream_kwargs(
            deltas, tool="gemma4", reasoning="gemma4", tok=TOK, chat_template_kwargs=kwargs
        )
        assert _comparable(pipeline.run(deltas)) == _comparable(expected), deltas


def test_argument_syntax() -> None:
    raw = f"a:{Q}x, y{Q},n:-1.5,b:true,l:[{Q}p{Q},2,[3]],o:{{k:{Q}v{Q}}},e:{Q}{Q}}}"
    assert gemma4_arg_converter(raw, False) == (
        '{"a": "x, y", "n": "-1.5", "b": "true", "l": ["p", "2", ["3"]], "o": {"k": "v"}, "e": ""}'
    )
    # Streaming withholds a bare value that may still grow and a cut delimiter.
    assert gemma4_arg_converter(f"a:{Q}Par<|", True) == '{"a": "Par"}'
    assert gemma4_arg_converter("a:1,b:10", True) == '{"a": "1"}'


def test_registry_defaults_are_vllms() -> None:
    # Thinking is off by default: vLLM then streams everything as content.
    parser = reasoning_parser("gemma4")
    assert parser.reasoning_ended
    assert parser.extract("<|channel>thought\na<channel|>b").reasoning == "a"
    assert not Gemma4ReasoningParser(enable_thinking=True).reasoning_ended
    assert not Gemma4ReasoningParser.for_request(
        ParserContext(chat_template_kwargs={"enable_thinking": True})
    ).reasoning_ended
    assert Gemma4ReasoningParser.keeps_special_tokens and Gemma4ToolParser.keeps_special_tokens
    assert tool_parser("gemma4").name == "gemma4"


PROMPTS = [
    "<|turn>model\n",
    "<|turn>model\n<|channel>thought\n",
    "<|channel>a<channel|><|turn>model\n",
    "<|turn>model\n<|channel>thought\na<channel|>",
    "<|channel>x<|tool_response>y",
    "<|tool_call>call:f{}<tool_call|>",
]


@pytest.mark.parametrize("variant", THINKING)
@pytest.mark.parametrize("prompt", PROMPTS)
def test_prompt_ends_reasoning_matches_vllm(prompt: str, variant: str) -> None:
    kwargs = THINKING[variant]
    expected, tokens = vllm_prompt_ends_reasoning(
        prompt, reasoning="gemma4", tok=TOK, chat_template_kwargs=kwargs
    )
    assert (
        Gemma4ReasoningParser.for_request(
            ParserContext(chat_template_kwargs=kwargs)
        ).prompt_ends_reasoning(tokens)
        == expected
    )
