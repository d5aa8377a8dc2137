"""glm45 / glm47 tool and reasoning parsers against vLLM 0.32's, whole and streamed, alone and
together."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.parsers import (
    REASONING_PARSERS,
    TOOL_PARSERS,
    ParserContext,
    ReasoningResult,
    ToolParser,
    reasoning_parser,
    tool_parser,
)
from gateway.parsers.glm45_reasoning import Glm45ReasoningParser
from gateway.parsers.glm45_tool import Glm45ToolParser
from tests.unit.gateway.parsers.test_qwen3_coder_parsers import TOOLS, ids_misaligned
from tests.unit.gateway.parsers.vllm_reference import (
    TOOL_ID_RE,
    ReasoningThenTools,
    our_stream,
    token_deltas,
    tokenizer,
    two_delta_splits,
    vllm_stream,
    vllm_whole,
)

# GLM-4.5's tokenizer has its markers as added tokens (vLLM matches the first four by id) and
# its turn starts among its special tokens (vLLM removes those).
MARKERS = (
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
)
TURNS = ("<|system|>", "<|user|>", "<|assistant|>", "<|observation|>")
TOK = tokenizer(MARKERS, TURNS)
SPECIAL = tuple(TOK.all_special_tokens)


def call(name: str, *args: tuple[str, str], sep: str = "\n") -> str:
    """A call as GLM-4.5 writes it (GLM-4.7: ``sep=""``)."""
    body = "".join(f"<arg_key>{k}</arg_key>{sep}<arg_value>{v}</arg_value>{sep}" for k, v in args)
    return f"<tool_call>{name}{sep}{body}</tool_call>"


PARIS = call("get_weather", ("city", "Paris"))
TOKYO = call("get_weather", ("city", "Tōkyō 東京 🙂"), sep="")
TYPED = call(
    "search",
    ("query", "q"),
    ("limit", "5"),
    ("threshold", "0.5"),
    ("exact", "false"),
    ("filters", '{"year": "1"}'),
    ("tags", '["a"]'),
    sep="",
)
TOOL_SAMPLES = {
    "single_call": PARIS,
    "single_call_glm47": call("get_weather", ("city", "Paris"), sep=""),
    "typed_arguments": TYPED,
    "nullable_and_enum": call("search", ("since", "null"), ("unit", "f")),
    "parallel_calls": f"{PARIS}\n{TOKYO}",
    "text_before_call": f"Let me check.\n{PARIS}",
    "text_after_call": f"{PARIS}\nDone.",
    "cut_off_in_value": "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Par",
    "cut_off_in_key": "<tool_call>search\n<arg_key>lim",
    "cut_off_in_name": "<tool_call>get_wea",
    "no_arguments": call("ping"),
    "unknown_tool_dropped": f"Try: {call('launch', ('count', '3'))} then {PARIS}",
    "spaces_around_names": (
        "<tool_call> get_weather \n<arg_key> city </arg_key> <arg_value> Rome </arg_value>"
        "</tool_call>"
    ),
    "multiline_value": call("search", ("query", "\nline one\n\nline two\n")),
    "markup_inside_value": call("search", ("query", "a < b > c <b>x</b>")),
    "uncoercible_values": call("search", ("limit", "five"), ("exact", "maybe"), ("tags", "[1,")),
    "untyped_tool": call("ping", ("host", "10")),
    "value_without_key": "<tool_call>get_weather<arg_value>Paris</arg_value></tool_call>",
    "no_end_tag": "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value>",
    "think_tags_in_content": f"Done.</think> <think>\n{PARIS}",
    "no_call": "The answer is 4 < 5 > 3.",
    "special_tokens": f"Hi<|user|>\n{call('search', ('query', 'a<|endoftext|>b'))}<|observation|>",
    "unicode_text_before": f"Prüfe 東京…\n{TOKYO}",
}


def whole_tools(parser: ToolParser, text: str) -> tuple[str | None, list[tuple[str, str]]]:
    result = parser.extract(text)
    assert result.tools_called == bool(result.tool_calls)
    assert all(TOOL_ID_RE.fullmatch(c.id) and c.type == "function" for c in result.tool_calls)
    return result.content, [(c.name, c.arguments) for c in result.tool_calls]


@pytest.mark.parametrize("name", ["glm45", "glm47"])
@pytest.mark.parametrize("sample", TOOL_SAMPLES)
def test_tools_whole_output_matches_vllm(name: str, sample: str) -> None:
    text = TOOL_SAMPLES[sample]
    _, content, calls = vllm_whole(text, tool=name, tok=TOK, tools=TOOLS)
    parser = TOOL_PARSERS[name](tools=TOOLS, special_tokens=SPECIAL)
    assert whole_tools(parser, text) == (content, calls)


@pytest.mark.parametrize("sample", TOOL_SAMPLES)
def test_tools_streaming_matches_vllm(sample: str) -> None:
    text = TOOL_SAMPLES[sample]
    # Splits that cut <tool_call> etc. are included: both sides then read the marker as text.
    for deltas in [token_deltas(text, TOK), [text], *two_delta_splits(text)]:
        ours = our_stream(Glm45ToolParser(tools=TOOLS, special_tokens=SPECIAL), deltas)
        expected = vllm_stream(deltas, tool="glm45", tok=TOK, tools=TOOLS)
        assert ours.comparable() == expected.comparable(), deltas


def test_typed_arguments_and_unknown_tools() -> None:
    (typed,) = Glm45ToolParser(tools=TOOLS).extract(TYPED).tool_calls
    assert typed.arguments == (
        '{"query": "q", "limit": 5, "threshold": 0.5, "exact": false, "filters": {"year": "1"}, '
        '"tags": ["a"]}'
    )
    # Without tools nothing is typed and no name is refused.
    result = Glm45ToolParser().extract(call("launch", ("count", "3")))
    assert [(c.name, c.arguments) for c in result.tool_calls] == [("launch", '{"count": "3"}')]


REASONING_CALL = call("get_weather", ("city", "Paris"), sep="")
REASONING_SAMPLES = {
    "reasoning_then_answer": "<think>\nLet me think.\n</think>\n\nThe answer is 4.",
    "no_start_tag": "Let me think.</think>\n\nThe answer is 4.",
    "never_closed": "<think>Let me think, and think again  \n",
    "trailing_whitespace": "<think>Hm.  \n\n</think>Yes.",
    "reasoning_then_tool_call": f"<think>Call the tool.</think>\n\n{REASONING_CALL}",
    "tool_call_inside_reasoning": f"<think>Call the tool.{REASONING_CALL}",
    "empty_reasoning": "<think></think>Answer",
    "second_end_tag": "<think>a</think>b</think>c",
    "second_start_tag": "<think>a<think>b</think>c",
    "reasoning_again_in_content": "<think>a</think>b<think>c</think>d",
    "text_before_start": "hmm<think>a</think>b",
    "unicode": "<think>考虑一下 é 🙂</think>答案：✓ naïve",
    "angle_brackets": "<think>a < b and <thin ice</think>x <arg_key> y",
    "special_tokens": "<think>a<|user|>b</think>c<|endoftext|>d",
}


@pytest.mark.parametrize("name", ["glm45", "glm47"])
@pytest.mark.parametrize("sample", REASONING_SAMPLES)
def test_reasoning_whole_output_matches_vllm(name: str, sample: str) -> None:
    text = REASONING_SAMPLES[sample]
    reasoning, content, _ = vllm_whole(text, reasoning=name, tok=TOK)
    parser = REASONING_PARSERS[name](special_tokens=SPECIAL)
    assert parser.extract(text) == ReasoningResult(reasoning, content)


@pytest.mark.parametrize("sample", REASONING_SAMPLES)
def test_reasoning_streaming_matches_vllm(sample: str) -> None:
    text = REASONING_SAMPLES[sample]
    # Splits that cut a marker are included: both sides then read it as plain text.
    for deltas in [token_deltas(text, TOK), [text], *two_delta_splits(text)]:
        ours = our_stream(Glm45ReasoningParser(special_tokens=SPECIAL), deltas)
        assert ours.comparable() == vllm_stream(deltas, reasoning="glm45", tok=TOK).comparable()


@pytest.mark.parametrize(
    "text",
    [
        f"<think>Call it.</think>\n\n{PARIS}",
        f"<think>Call it.  {PARIS}\nDone.",
        f"<think>a</think>b</think>{PARIS}</think>c",
        f"<think>a</think>b<think>c </think>{TOKYO}<think>d",
    ],
)
def test_glm45_then_glm45_matches_vllm(text: str) -> None:
    reasoning, content, calls = vllm_whole(
        text, tool="glm45", reasoning="glm45", tok=TOK, tools=TOOLS
    )
    split = Glm45ReasoningParser(special_tokens=SPECIAL).extract(text)
    tools = Glm45ToolParser(tools=TOOLS, after_reasoning_parser=True, special_tokens=SPECIAL)
    assert (split.reasoning, *whole_tools(tools, split.content or "")) == (
        reasoning,
        content,
        calls,
    )
    for deltas in [token_deltas(text, TOK), [text], *two_delta_splits(text)]:
        if ids_misaligned(deltas, consumed=("<think>", *SPECIAL)):
            continue  # see ids_misaligned: vLLM then reads a call from ids, not text
        pipeline = ReasoningThenTools(
            Glm45ReasoningParser(special_tokens=SPECIAL),
            Glm45ToolParser(tools=TOOLS, after_reasoning_parser=True, special_tokens=SPECIAL),
        )
        expected = vllm_stream(deltas, tool="glm45", reasoning="glm45", tok=TOK, tools=TOOLS)
        assert pipeline.run(deltas).comparable() == expected.comparable(), deltas


def _vllm_parser(**kwargs: Any) -> Any:
    from vllm.parser.parser_manager import ParserManager

    cls = ParserManager.get_parser(
        tool_parser_name="glm45", reasoning_parser_name="glm45", enable_auto_tools=True
    )
    return cls(TOK, TOOLS, **kwargs)


@pytest.mark.parametrize("kwargs", [{"enable_thinking": False}, {"thinking": False}, {}])
def test_thinking_switch_matches_vllm(kwargs: dict[str, Any]) -> None:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    text = f"<think>a</think>b{PARIS}"
    request = ChatCompletionRequest(model="m", messages=[], tools=TOOLS)
    parser = _vllm_parser(chat_template_kwargs=kwargs)
    reasoning, content, calls = parser.parse(text, request, enable_auto_tools=True)
    ours = Glm45ReasoningParser.for_request(ParserContext(chat_template_kwargs=kwargs))
    split = ours.extract(text)
    tools = Glm45ToolParser(tools=TOOLS, after_reasoning_parser=True, thinking=ours.thinking)
    assert (split.reasoning, *whole_tools(tools, split.content or "")) == (
        reasoning,
        content,
        [(c.name, c.arguments) for c in calls or []],
    )


@pytest.mark.parametrize(
    "prompt",
    [
        ["<|user|>", "hi", "<|assistant|>"],
        ["<|user|>", "hi", "<|assistant|>", "<think>"],
        ["<|user|>", "hi", "<|assistant|>", "<think>", "</think>"],
        ["<|assistant|>", "<think>", "</think>", "ok", "<|user|>", "hi", "<|assistant|>"],
        ["<|assistant|>", "<tool_call>", "f", "</tool_call>"],
        ["<think>", "a", "</think>", "b"],
    ],
)
def test_prompt_ends_reasoning_matches_vllm(prompt: list[str]) -> None:
    ids = [i for piece in prompt for i in TOK.encode(piece)]
    expected = _vllm_parser().is_reasoning_end(ids)
    assert Glm45ReasoningParser().prompt_ends_reasoning(prompt) == expected
    off = _vllm_parser(chat_template_kwargs={"enable_thinking": False}).is_reasoning_end(ids)
    assert Glm45ReasoningParser(thinking=False).prompt_ends_reasoning(prompt) == off


@pytest.mark.parametrize("sample", ["reasoning_then_tool_call", "tool_call_inside_reasoning"])
def test_reasoning_token_count_matches_vllm(sample: str) -> None:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    text = f"{REASONING_SAMPLES[sample]} and more"
    request = ChatCompletionRequest(model="m", messages=[], tools=TOOLS)
    parser, ids = _vllm_parser(), TOK.encode(text)
    for n, token_id in enumerate(ids):
        delta = TOK.decode([token_id], skip_special_tokens=False)
        parser.parse_delta(delta, [token_id], request, [], finished=n == len(ids) - 1)
    tokens = TOK.convert_ids_to_tokens(ids)
    assert Glm45ReasoningParser().count_reasoning_tokens(tokens) == parser.count_reasoning_tokens(
        ids
    )


def test_registered_names() -> None:
    # vLLM maps both names to the same classes.
    assert type(tool_parser("glm45")) is type(tool_parser("glm47")) is Glm45ToolParser
    assert (
        type(reasoning_parser("glm45")) is type(reasoning_parser("glm47")) is Glm45ReasoningParser
    )
