"""hermes tool parser against vLLM 0.32's, whole and streamed, alone and after qwen3."""

from __future__ import annotations

import pytest

from gateway.parsers import reasoning_parser, tool_parser
from tests.unit.gateway.parsers.vllm_reference import (
    TOOL_ID_RE,
    ReasoningThenTools,
    our_stream,
    token_deltas,
    two_delta_splits,
    vllm_stream,
    vllm_whole,
)

PARIS = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TOKYO = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Tōkyō 東京 🙂"}}\n</tool_call>'
SAMPLES = {
    "single_call": PARIS,
    "parallel_calls": f"{PARIS}\n{TOKYO}",
    "text_before_call": f"Let me check.\n{PARIS}",
    "text_after_call": f"{PARIS}\nDone.",
    "cut_off_mid_json": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',
    "cut_off_in_name": '<tool_call>\n{"name": "get_wea',
    "no_end_tag": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}',
    # One closing brace short.
    "invalid_json": '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}</tool_call>',
    "not_json": "<tool_call>not json</tool_call>",
    "missing_arguments": '<tool_call>{"name": "get_weather"}</tool_call>',
    "arguments_before_name": '<tool_call>{"arguments": {"city": "Paris"}, "name": "f"}</tool_call>',
    "no_call": "The answer is 4 < 5.",
    "unicode_text_before": f"Prüfe 東京…\n{TOKYO}",
}


@pytest.mark.parametrize("sample", SAMPLES)
def test_whole_output_matches_vllm(sample: str) -> None:
    text = SAMPLES[sample]
    _, content, calls = vllm_whole(text, tool="hermes")
    result = tool_parser("hermes").extract(text)
    assert result.tools_called == bool(calls)
    assert [(c.name, c.arguments) for c in result.tool_calls] == calls
    assert result.content == content
    assert all(TOOL_ID_RE.fullmatch(c.id) and c.type == "function" for c in result.tool_calls)


@pytest.mark.parametrize("sample", SAMPLES)
def test_streaming_matches_vllm(sample: str) -> None:
    text = SAMPLES[sample]
    for deltas in [token_deltas(text), [text], *two_delta_splits(text)]:
        ours = our_stream(tool_parser("hermes"), deltas)
        assert ours.comparable() == vllm_stream(deltas, tool="hermes").comparable(), deltas


@pytest.mark.parametrize(
    "text",
    [f"<think>Call it.</think>\n\n{PARIS}", f"<think>Call it.{PARIS}", "<think>a</think>b"],
)
def test_qwen3_then_hermes_matches_vllm(text: str) -> None:
    reasoning, content, calls = vllm_whole(text, tool="hermes", reasoning="qwen3")
    split = reasoning_parser("qwen3").extract(text)
    result = tool_parser("hermes").extract(split.content or "")
    assert (split.reasoning, result.content) == (reasoning, content)
    assert [(c.name, c.arguments) for c in result.tool_calls] == calls
    for deltas in [token_deltas(text), [text], *two_delta_splits(text)]:
        pipeline = ReasoningThenTools(reasoning_parser("qwen3"), tool_parser("hermes"))
        expected = vllm_stream(deltas, tool="hermes", reasoning="qwen3")
        assert pipeline.run(deltas).comparable() == expected.comparable(), deltas


def test_streamed_call_pieces() -> None:
    parser = tool_parser("hermes")
    first = parser.feed('Hi <tool_call>{"name": "f", "arguments": {"a": ')
    assert first is not None and first.content == "Hi "
    head, args = first.tool_calls
    assert (head.index, head.type, head.name, head.arguments) == (0, "function", "f", None)
    assert TOOL_ID_RE.fullmatch(head.id or "")
    # The body is stripped before the arguments are cut out, hence no trailing space.
    assert (args.index, args.id, args.arguments) == (0, None, '{"a":')
    last = parser.feed("1}}</tool_call>")
    assert last is not None and [c.arguments for c in last.tool_calls] == [" 1}"]
    assert parser.finish() is None
