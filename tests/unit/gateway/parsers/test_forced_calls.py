"""Forced tool calls (tool_choice "required" / named) against vLLM 0.32's generic JSON path.

The reference is vLLM's ``DelegatingParser`` for ``pythonic`` (a parser with no native forced
format, so vLLM reads the JSON itself), fed a request with the forced ``tool_choice``. Streams
are compared delta by delta, not only assembled: the chat service sends what ``feed`` returns.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import pytest

from gateway.parsers import DeltaMessage, ToolParser
from gateway.parsers.forced_calls import NamedCallParser, RequiredCallsParser
from tests.unit.gateway.parsers.vllm_reference import (
    TOOL_ID_RE,
    _vllm_parser,
    token_deltas,
    tokenizer,
    two_delta_splits,
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}},
        },
    },
]
NAMED = {"type": "function", "function": {"name": "get_weather"}}

PARIS = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
UTC = '{"name": "get_time", "parameters": {"tz": "UTC"}}'
NESTED = (
    '{"name": "get_weather", "parameters": {"filter": {"tags": ["a", {"b": [1, 2.5e3, null, '
    'true]}], "depth": -0.0}, "limit": 10, "big": 123456789012345678901234567890}}'
)
TRICKY_STRING = (
    r'{"name": "get_weather", "parameters": {"q": "a } ] { [ \" \\ \n \t \u00e9 \ud83d\ude42 '
    'Tōkyō 東京 🙂", "k\\"ey": "}"}}'
)
REQUIRED_SAMPLES = {
    "single_call": f"[{PARIS}]",
    "several_calls": f"[{PARIS}, {UTC}, {PARIS}]",
    "nested_parameters": f"[{NESTED}]",
    "strings_with_braces_quotes_escapes_unicode": f"[{TRICKY_STRING}]",
    "compact": '[{"name":"get_time","parameters":{}},{"name":"get_weather","parameters":{"a":1}}]',
    "pretty_printed": '[\n  {\n    "name": "get_weather",\n    "parameters": {\n'
    '      "city": "Paris"\n    }\n  }\n]',
    "leading_and_trailing_whitespace": f"\n  [{PARIS}]  \n",
    "parameters_before_name": '[{"parameters": {"city": "Paris"}, "name": "get_weather"}]',
    "extra_keys": '[{"name": "get_time", "description": "d", "strict": true, "x": [1], '
    '"parameters": {"tz": "UTC"}}]',
    "escaped_and_unicode_name": r'[{"name": "get_\u0077eather", "parameters": {}}, '
    '{"name": "天気", "parameters": {}}]',
    "missing_parameters": '[{"name": "get_time"}]',
    "null_parameters": '[{"name": "get_time", "parameters": null}]',
    "scalar_parameters": '[{"name": "get_time", "parameters": 5}, {"name": "f", "parameters": 1}]',
    "array_parameters": '[{"name": "get_time", "parameters": [1, 2]}]',
    "nan_and_infinity": '[{"name": "get_time", "parameters": {"a": NaN, "b": -Infinity}}]',
    "lone_surrogate": r'[{"name": "get_time", "parameters": {"a": "\ud800"}}]',
    "wrong_field_type": '[{"name": "get_time", "parameters": {}, "strict": "maybe"}]',
    "name_not_a_string": '[{"name": 5, "parameters": {}}]',
    "duplicate_keys": '[{"name": "f", "name": "get_time", "parameters": {"a": 1, "a": 2}}]',
    "empty_array": "[]",
    "cut_off_mid_parameters": f'[{PARIS}, {{"name": "get_time", "parameters": {{"tz": "Eur',
    "cut_off_in_name": f'[{PARIS}, {{"name": "get_ti',
    "cut_off_after_name": '[{"name": "get_time", ',
    "cut_off_before_first_call": "[",
    "missing_closing_bracket": f"[{PARIS}",
    "text_after_array": f"[{PARIS}] and more [{UTC}]",
    "text_before_array": f"Sure: [{PARIS}]",
    "object_not_array": PARIS,
    "not_json": "I cannot call a tool.",
    "mismatched_brackets": '[{"name": "get_time", "parameters": {"a": [1}]}]',
    "empty": "",
    "whitespace": " \n\t ",
    # Past pydantic's JSON nesting limit: rejected whole, streamed all the same.
    "deep_nesting": '[{"name": "get_time", "parameters": {"a": ' + "[" * 260 + "]" * 260 + "}}]",
}
NAMED_SAMPLES = {
    "arguments_object": '{"city": "Paris"}',
    "nested_unicode_arguments": '{"city": "Tōkyō 東京 🙂", "opts": {"units": ["c"], "n": 1.50}}',
    "escapes": r'{"q": "a \"b\" \\ \n }"}',
    "leading_whitespace": '\n\n{"city": "Paris"}',
    "cut_off": '{"city": "Par',
    "not_json": "Paris please",
    "empty": "",
    "whitespace": "  \n ",
}
# Long samples: every two-delta split would make the file slow; past this many, all splits near
# both ends and an even sample of the middle.
MAX_EVERY_SPLIT = 120


@functools.cache
def _request(choice: str) -> Any:
    """The request vLLM's parser reads tool_choice from ("named" stands for ``NAMED``)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        tools=TOOLS,
        tool_choice=NAMED if choice == "named" else choice,
    )


def _reference() -> Any:
    # pythonic has no native forced format, so vLLM takes its generic JSON path for it.
    return _vllm_parser("pythonic", None, tokenizer(), TOOLS)


def _ours(choice: str) -> ToolParser:
    return NamedCallParser("get_weather") if choice == "named" else RequiredCallsParser()


def vllm_whole(text: str, choice: str) -> tuple[str | None, list[tuple[str, str]]]:
    """vLLM's non-streamed (content, [(name, arguments)])."""
    _, content, calls = _reference().parse(text, _request(choice), enable_auto_tools=True)
    return content, [(c.name, c.arguments) for c in calls or []]


Piece = tuple[int, bool, str | None, str | None, str]  # index, has id, type, name, arguments
Message = tuple[str | None, tuple[Piece, ...]]


def _check_id(call_id: str | None) -> bool:
    assert call_id is None or TOOL_ID_RE.fullmatch(call_id), call_id
    return call_id is not None


def vllm_messages(deltas: Sequence[str], choice: str) -> list[Message | None]:
    """vLLM's parse_delta result per delta, as the server calls it."""
    tok = tokenizer()
    parser, request = _reference(), _request(choice)
    prompt_ids = tok.encode("<|im_start|>assistant\n")
    out: list[Message | None] = []
    for i, delta in enumerate(deltas):
        msg = parser.parse_delta(
            delta, tok.encode(delta), request, prompt_ids, finished=i == len(deltas) - 1
        )
        if msg is None:
            out.append(None)
            continue
        assert not msg.reasoning
        pieces = tuple(
            (c.index, _check_id(c.id), c.type, c.function.name, c.function.arguments or "")
            for c in msg.tool_calls
        )
        out.append((msg.content, pieces))
    return out


def our_messages(parser: ToolParser, deltas: Sequence[str]) -> list[Message | None]:
    out: list[Message | None] = []
    for delta in deltas:
        msg = parser.feed(delta)
        out.append(_ours_message(msg))
    assert parser.finish() is None  # vLLM's finalize_generation adds nothing on these paths
    return out


def _ours_message(msg: DeltaMessage | None) -> Message | None:
    if msg is None:
        return None
    assert not msg.reasoning
    pieces = tuple(
        (c.index, _check_id(c.id), c.type, c.name, c.arguments or "") for c in msg.tool_calls
    )
    return msg.content, pieces


def _delta_lists(text: str) -> list[list[str]]:
    lists = [token_deltas(text), [text]]
    splits = two_delta_splits(text)
    if len(splits) > MAX_EVERY_SPLIT:
        step = len(splits) // MAX_EVERY_SPLIT + 1
        splits = splits[:20] + splits[20:-20:step] + splits[-20:]
    return lists + splits if text else lists


CASES = [("required", name) for name in REQUIRED_SAMPLES] + [
    ("named", name) for name in NAMED_SAMPLES
]


def _text(choice: str, name: str) -> str:
    return (REQUIRED_SAMPLES if choice == "required" else NAMED_SAMPLES)[name]


@pytest.mark.parametrize(("choice", "sample"), CASES)
def test_whole_output_matches_vllm(choice: str, sample: str) -> None:
    text = _text(choice, sample)
    content, calls = vllm_whole(text, choice)
    result = _ours(choice).extract(text)
    assert result.content == content
    assert [(c.name, c.arguments) for c in result.tool_calls] == calls
    assert result.tools_called == bool(calls)
    assert all(TOOL_ID_RE.fullmatch(c.id) and c.type == "function" for c in result.tool_calls)


@pytest.mark.parametrize(("choice", "sample"), CASES)
def test_streaming_matches_vllm_delta_by_delta(choice: str, sample: str) -> None:
    text = _text(choice, sample)
    for deltas in _delta_lists(text):
        if not deltas or not all(deltas):
            continue  # the empty sample has no deltas to send
        ours = our_messages(_ours(choice), deltas)
        assert ours == vllm_messages(deltas, choice), deltas


def test_samples_tokenize_into_several_deltas() -> None:
    # Guards the token-by-token case against a tokenizer that swallows a sample whole.
    assert len(token_deltas(REQUIRED_SAMPLES["several_calls"])) > 10


def test_required_results() -> None:
    # What the comparisons above pin down, spelt out for the reader.
    result = RequiredCallsParser().extract(REQUIRED_SAMPLES["several_calls"])
    assert [(c.name, c.arguments) for c in result.tool_calls] == [
        ("get_weather", '{"city": "Paris"}'),
        ("get_time", '{"tz": "UTC"}'),
        ("get_weather", '{"city": "Paris"}'),
    ]
    assert len({c.id for c in result.tool_calls}) == 3
    assert RequiredCallsParser().extract('[{"name": "get_time"}]').tool_calls[0].arguments == "null"
    assert RequiredCallsParser().extract(f"[{PARIS}").tool_calls == []
    assert RequiredCallsParser().extract(f"[{PARIS}").content is None


def test_required_stream_pieces() -> None:
    parser = RequiredCallsParser()
    assert parser.feed('[{"name": "get_weather", ') is None
    first = parser.feed('"parameters": {"ci')
    assert first is not None
    [piece] = first.tool_calls
    assert (piece.index, piece.name, piece.arguments) == (0, "get_weather", '{"ci')
    rest = parser.feed('ty": "Paris"}}, {"name": "get_time", "parameters": {}}] trailing')
    assert rest is not None
    assert [(p.index, p.name, p.arguments) for p in rest.tool_calls] == [
        (0, None, 'ty": "Paris"}'),
        (1, "get_time", "{}"),
    ]
    assert parser.feed(" text") is None


def test_named_stream_pieces() -> None:
    parser = NamedCallParser("get_weather")
    first = parser.feed(' {"ci')
    assert first is not None
    [piece] = first.tool_calls
    assert (piece.index, piece.type, piece.name, piece.arguments) == (
        0,
        "function",
        "get_weather",
        ' {"ci',
    )
    assert TOOL_ID_RE.fullmatch(piece.id or "")
    assert parser.feed("") is None
    later = parser.feed('ty": "Paris"}')
    assert later is not None
    assert [(p.id, p.name, p.arguments) for p in later.tool_calls] == [
        (None, None, 'ty": "Paris"}')
    ]
