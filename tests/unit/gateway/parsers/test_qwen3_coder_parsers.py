"""qwen3_coder / qwen3_xml tool parser against vLLM 0.32's, whole and streamed, alone and after
the qwen3 reasoning parser."""

from __future__ import annotations

import pytest

from gateway.parsers import (
    TOOL_PARSERS,
    ToolParser,
    reasoning_parser,
    tool_parser,
)
from gateway.parsers.qwen3_coder_tool import Qwen3CoderToolParser
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

# Qwen3-Coder's tokenizer has <think>, </think>, <tool_call>, </tool_call> as added non-special
# tokens (vLLM matches those four by id), the reference tokenizer's defaults; vLLM removes its
# special tokens, here <|im_end|> and <|endoftext|>.
SPECIAL = tuple(tokenizer().all_special_tokens)
SEARCH_PROPERTIES = {
    "query": {"type": "string"},
    "limit": {"type": "integer"},
    "threshold": {"type": "number"},
    "exact": {"type": "boolean"},
    "filters": {"type": "object", "properties": {"year": {"type": "integer"}}},
    "tags": {"type": "array", "items": {"type": "string"}},
    "since": {"type": ["string", "null"]},
    "unit": {"enum": ["c", "f"]},
}
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
            "name": "search",
            "parameters": {"type": "object", "properties": SEARCH_PROPERTIES},
        },
    },
    {"type": "function", "function": {"name": "ping"}},  # no parameters schema
]


def call(name: str, *params: tuple[str, str]) -> str:
    """A call as Qwen3-Coder writes it."""
    body = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in params)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


PARIS = call("get_weather", ("city", "Paris"))
JSON_BODY = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
TOKYO = call("get_weather", ("city", "Tōkyō 東京 🙂"))
TYPED = call(
    "search",
    ("query", "q"),
    ("limit", "5"),
    ("threshold", "0.5"),
    ("exact", "true"),
    ("filters", '{"year": 1}'),
    ("tags", '["a"]'),
)
SAMPLES = {
    "single_call": PARIS,
    "typed_parameters": TYPED,
    "nullable_and_enum": call("search", ("since", "null"), ("unit", "c")),
    "parallel_calls": f"{PARIS}\n{TOKYO}",
    "text_before_call": f"Let me check.\n{PARIS}",
    "text_after_call": f"{PARIS}\nDone.",
    "cut_off_in_string_value": "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
    "cut_off_in_integer_value": "<tool_call>\n<function=search>\n<parameter=limit>\n1",
    "cut_off_in_function_name": "<tool_call>\n<function=get_wea",
    "cut_off_after_start": "Sure.\n<tool_call>\n",
    "unclosed_parameters": (
        "<tool_call>\n<function=search>\n<parameter=query>\nx\n<parameter=limit>\n3\n"
        "</function>\n</tool_call>"
    ),
    "no_tool_call_tags": "I will call <function=get_weather>\n<parameter=city>\nRome\n</function>",
    "no_end_tags": "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n",
    "no_parameters": call("ping"),
    "untyped_tool": call("ping", ("host", "10")),
    "unknown_tool": call("launch", ("count", "3")),
    "uncoercible_values": call("search", ("limit", "five"), ("exact", "maybe"), ("tags", "[1,")),
    "markup_inside_value": call("search", ("query", "a < b > c <b>x</b>\n\nsecond line")),
    "json_body": f"<tool_call>\n{JSON_BODY}\n</tool_call>",
    "think_tags_in_content": f"Done.</think> <think>\n{PARIS}",
    "no_call": "The answer is 4 < 5 > 3.",
    "special_tokens": f"Hi<|im_end|>\n{call('search', ('query', 'a<|endoftext|>b'))}<|im_end|>",
    "unicode_text_before": f"Prüfe 東京…\n{TOKYO}",
}


def whole(parser: ToolParser, text: str) -> tuple[None, str | None, list[tuple[str, str]]]:
    result = parser.extract(text)
    assert result.tools_called == bool(result.tool_calls)
    assert all(TOOL_ID_RE.fullmatch(c.id) and c.type == "function" for c in result.tool_calls)
    return None, result.content, [(c.name, c.arguments) for c in result.tool_calls]


@pytest.mark.parametrize("name", ["qwen3_coder", "qwen3_xml"])
@pytest.mark.parametrize("sample", SAMPLES)
def test_whole_output_matches_vllm(name: str, sample: str) -> None:
    text = SAMPLES[sample]
    expected = vllm_whole(text, tool=name, tools=TOOLS)
    assert whole(TOOL_PARSERS[name](tools=TOOLS, special_tokens=SPECIAL), text) == expected


@pytest.mark.parametrize("sample", SAMPLES)
def test_streaming_matches_vllm(sample: str) -> None:
    text = SAMPLES[sample]
    # Splits that cut <tool_call> etc. are included: both sides then read the marker as text
    # (vLLM matches it by token id once ids flow; a real stream never cuts the token).
    for deltas in [token_deltas(text), [text], *two_delta_splits(text)]:
        ours = our_stream(Qwen3CoderToolParser(tools=TOOLS, special_tokens=SPECIAL), deltas)
        expected = vllm_stream(deltas, tool="qwen3_coder", tools=TOOLS)
        assert ours.comparable() == expected.comparable(), deltas


def test_typed_arguments() -> None:
    result = Qwen3CoderToolParser(tools=TOOLS).extract(TYPED)
    assert result.tool_calls[0].arguments == (
        '{"query": "q", "limit": 5, "threshold": 0.5, "exact": true, "filters": {"year": 1}, '
        '"tags": ["a"]}'
    )
    # Without tools every value stays the string written.
    untyped = Qwen3CoderToolParser().extract(TYPED).tool_calls[0].arguments
    assert untyped.startswith('{"query": "q", "limit": "5", "threshold": "0.5"')


def test_streamed_call_pieces() -> None:
    parser = Qwen3CoderToolParser(tools=TOOLS)
    first = parser.feed("Hi <tool_call>\n<function=search>\n<parameter=query>\nab")
    assert first is not None and first.content == "Hi "
    # One piece per call and delta: the name, and the string value so far (it may stream
    # while open: it can only grow).
    (head,) = first.tool_calls
    assert (head.index, head.type, head.name) == (0, "function", "search")
    assert head.arguments == '{"query": "ab' and TOOL_ID_RE.fullmatch(head.id or "")
    # An integer waits until its parameter closes (typing may still change its spelling).
    more = parser.feed("c\n</parameter>\n<parameter=limit>\n4")
    assert more is not None and [c.arguments for c in more.tool_calls] == ['c", "limit": ']
    last = parser.feed("2\n</parameter>\n</function>\n</tool_call>")
    assert last is not None and [c.arguments for c in last.tool_calls] == ["42}"]
    assert parser.finish() is None


def ids_misaligned(deltas: list[str], consumed: tuple[str, ...] = ()) -> bool:
    """Whether vLLM hands its tool parser text and token ids that do not match, which a
    text-only parser cannot see. The delta that ends reasoning gives it the content after the
    first end marker but the ids after the delta's last ``</think>`` (or from its ``<tool_call>``),
    so call markers before that ``</think>`` are read as text, and markers the reasoning pass
    took out of the content after it (``consumed``: GLM's ``<think>``) still arrive as ids.
    Both take several markers in one delta."""
    for delta in deltas:
        found = [i for i in (delta.find("</think>"), delta.find("<tool_call>")) if i != -1]
        if found:
            first = min(found)
            last_end = max(delta.rfind("</think>"), first)
            return any(m in delta[first:last_end] for m in ("<tool_call>", "</tool_call>")) or any(
                m in delta[last_end:] for m in consumed
            )
    return False


def _after_reasoning() -> Qwen3CoderToolParser:
    return Qwen3CoderToolParser(tools=TOOLS, special_tokens=SPECIAL, after_reasoning_parser=True)


@pytest.mark.parametrize(
    "text",
    [
        f"<think>Call it.</think>\n\n{PARIS}",
        f"<think>Call it.{PARIS}",
        f"<think>a</think>b</think>{PARIS}</think>c",
        "<think>a</think>b<think>c",
    ],
)
def test_qwen3_then_qwen3_coder_matches_vllm(text: str) -> None:
    reasoning, content, calls = vllm_whole(text, tool="qwen3_coder", reasoning="qwen3", tools=TOOLS)
    split = reasoning_parser("qwen3").extract(text)
    tools = _after_reasoning()
    assert (split.reasoning, *whole(tools, split.content or "")[1:]) == (reasoning, content, calls)
    for deltas in [token_deltas(text), [text], *two_delta_splits(text)]:
        if ids_misaligned(deltas):
            continue
        pipeline = ReasoningThenTools(reasoning_parser("qwen3"), _after_reasoning())
        expected = vllm_stream(deltas, tool="qwen3_coder", reasoning="qwen3", tools=TOOLS)
        assert pipeline.run(deltas).comparable() == expected.comparable(), deltas


def test_registered_names() -> None:
    # vLLM maps both names to the same class.
    assert (
        type(tool_parser("qwen3_coder")) is type(tool_parser("qwen3_xml")) is Qwen3CoderToolParser
    )
