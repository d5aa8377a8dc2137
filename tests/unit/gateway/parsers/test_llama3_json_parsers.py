"""llama3_json / llama4_json tool parser against vLLM 0.32's, whole and streamed."""

from __future__ import annotations

import pytest

from gateway.parsers import tool_parser
from tests.unit.gateway.parsers.vllm_reference import (
    TOOL_ID_RE,
    Assembled,
    our_stream,
    token_deltas,
    tokenizer,
    two_delta_splits,
    vllm_stream,
    vllm_whole,
)

# Llama 3's <|python_tag|> is a special token; vLLM needs it in the vocabulary.
TOK = tokenizer((), ("<|python_tag|>",))
PARIS = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
TOKYO = '{"name": "get_weather", "arguments": {"city": "Tōkyō 東京 🙂", "days": [1, 2]}}'
SAMPLES = {
    "single_call": PARIS,
    "python_tag": f"<|python_tag|>{PARIS}",
    "parallel_calls": f"{PARIS}; {TOKYO}",
    "parallel_calls_after_tag": f"<|python_tag|>{TOKYO}; {PARIS}",
    "arguments_key": TOKYO,
    "nested_arguments": '{"name": "f", "parameters": {"a": {"b": [1, {"c": null}]}, "d": true}}',
    "empty_arguments": '{"name": "f", "parameters": {}}',
    "text_before_call": f"Let me check. {PARIS}",
    "text_after_call": f"{PARIS}\nDone.",
    "cut_off_mid_arguments": '{"name": "get_weather", "parameters": {"city": "Par',
    "cut_off_in_name": '{"name": "get_wea',
    "cut_off_after_name": '{"name": "get_weather", "param',
    "invalid_json": '{"name": "get_weather", "parameters": {"city": "Paris"}',
    "braces_in_text": "Use {braces} like this.",
    "missing_name": '{"parameters": {"city": "Paris"}}',
    "missing_arguments": '{"name": "get_weather"}',
    "both_keys": '{"name": "f", "arguments": {"a": 1}, "parameters": {"b": 2}}',
    "name_not_string": '{"name": 7, "parameters": {}}',
    "no_call": "The answer is 4.",
    "list_not_object": '<|python_tag|>[{"name": "f", "parameters": {}}]',
    "unicode_arguments": '{"name": "söz", "parameters": {"q": "naïve — ✓"}}',
    "no_separator": '{"name": "a", "parameters": {}}{"name": "b", "parameters": {}}',
    "newline_separator": f"{PARIS}\n{PARIS}",
}


def _comparable(out: Assembled) -> tuple:
    # Like Assembled.comparable, but vLLM itself may stream arguments for a call whose name
    # (and id) it never sent (several objects in one delta): compare which calls got ids.
    assert all(TOOL_ID_RE.fullmatch(i) for i in out.ids.values()), out.ids
    return out.reasoning, out.content, out.calls, set(out.ids)


@pytest.mark.parametrize("name", ["llama3_json", "llama4_json"])
@pytest.mark.parametrize("sample", SAMPLES)
def test_whole_output_matches_vllm(name: str, sample: str) -> None:
    text = SAMPLES[sample]
    _, content, calls = vllm_whole(text, tool=name, tok=TOK)
    result = tool_parser(name).extract(text)
    assert result.tools_called == bool(calls)
    assert [(c.name, c.arguments) for c in result.tool_calls] == calls
    assert result.content == content
    assert all(TOOL_ID_RE.fullmatch(c.id) and c.type == "function" for c in result.tool_calls)


@pytest.mark.parametrize("sample", SAMPLES)
def test_streaming_matches_vllm(sample: str) -> None:
    text = SAMPLES[sample]
    # Every split is compared, those cutting <|python_tag|> too: vLLM decides by text here.
    for deltas in [token_deltas(text, TOK), [text], *two_delta_splits(text)]:
        ours = our_stream(tool_parser("llama3_json"), deltas)
        expected = vllm_stream(deltas, tool="llama3_json", tok=TOK)
        assert _comparable(ours) == _comparable(expected), deltas


def test_streamed_call_pieces() -> None:
    parser = tool_parser("llama3_json")
    assert parser.feed('{"name": "f", ') is None  # partial parse: nothing sure yet
    head = parser.feed('"parameters": {"a": "x')
    assert head is not None and [(c.index, c.name) for c in head.tool_calls] == [(0, "f")]
    assert TOOL_ID_RE.fullmatch(head.tool_calls[0].id or "")
    grown = parser.feed('yz"}}')
    assert grown is not None and [c.arguments for c in grown.tool_calls] == ['{"a": "xyz"}']
    assert parser.finish() is None


def test_text_first_is_content() -> None:
    parser = tool_parser("llama3_json")
    msg = parser.feed('Hi {"name": "f", "parameters": {}}')
    assert msg is not None and msg.content == 'Hi {"name": "f", "parameters": {}}'
    assert not msg.tool_calls
