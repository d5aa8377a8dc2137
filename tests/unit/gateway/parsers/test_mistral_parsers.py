"""mistral tool parsers (v11+ and pre-v11) and mistral reasoning parser against vLLM 0.32's,
whole and streamed, alone and together, with Hugging Face tokenizers."""

from __future__ import annotations

import re
from typing import Any

import pytest

from gateway.parsers import ToolParser, reasoning_parser, tool_parser
from gateway.parsers.mistral_reasoning import MistralReasoningParser
from gateway.parsers.mistral_tool import (
    MistralPreV11ToolParser,
    MistralToolParser,
    mistral_tool_parser,
)
from tests.unit.gateway.parsers.vllm_reference import (
    Assembled,
    ReasoningThenTools,
    our_stream,
    token_deltas,
    tokenizer,
    two_delta_splits,
    vllm_stream,
    vllm_whole,
)


class _VocabOnce:
    """A tokenizer whose vocabulary is built once: vLLM's Mistral parser asks for it three
    times per instance, most of the cost of the thousands of reference streams here."""

    def __init__(self, tok: Any) -> None:
        self._tok, self._vocab = tok, tok.get_vocab()

    def get_vocab(self) -> dict[str, int]:
        return self._vocab

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tok, name)


# Special tokens as in Mistral's Hugging Face tokenizers: v11+ has [ARGS] (and [THINK] for
# Magistral), pre-v11 only [TOOL_CALLS]. vLLM picks its parsing path from these.
V11_THINK = _VocabOnce(tokenizer((), ("[TOOL_CALLS]", "[ARGS]", "[THINK]", "[/THINK]")))
V11 = _VocabOnce(tokenizer((), ("[TOOL_CALLS]", "[ARGS]")))
PRE_V11 = _VocabOnce(tokenizer((), ("[TOOL_CALLS]",)))
MARKERS = ("[TOOL_CALLS]", "[ARGS]", "[THINK]", "[/THINK]")
MISTRAL_ID_RE = re.compile(r"[A-Za-z0-9]{9}")

PARIS = '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'
TOKYO = '[TOOL_CALLS]get_weather[ARGS]{"city": "Tōkyō 東京 🙂", "days": [1, {"n": 2}]}'
V11_SAMPLES = {
    "single_call": PARIS,
    "brace_form": '[TOOL_CALLS]get_weather{"city": "Paris"}',
    "parallel_calls": PARIS + TOKYO,
    "text_before_call": f"Let me check.\n\n{PARIS}",
    "whitespace_before_call": f"\n\n{PARIS}",
    "text_after_call": f"{PARIS} Done.",
    "braces_in_strings": '[TOOL_CALLS]f[ARGS]{"q": "a}b{", "e": "x\\"}"}',
    "cut_off_mid_arguments": '[TOOL_CALLS]get_weather[ARGS]{"city": "Par',
    "cut_off_in_name": "[TOOL_CALLS]get_wea",
    "cut_off_after_args_marker": "[TOOL_CALLS]get_weather[ARGS]",
    "marker_only": "Hmm [TOOL_CALLS]",
    "invalid_json": '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"',
    "no_name": '[TOOL_CALLS][ARGS]{"a": 1}',
    "no_name_brace": '[TOOL_CALLS]{"a": 1}',
    "name_with_spaces": '[TOOL_CALLS] get_weather [ARGS] {"city": "Paris"} ',
    "string_arguments": '[TOOL_CALLS]f[ARGS]"text"',
    "array_arguments": "[TOOL_CALLS]f[ARGS][1, 2]",
    "think_markers_as_text": "[THINK]x[/THINK]y",
    "no_call": "The answer is 4.",
    "brackets_and_braces": "Use [b] and {c}: [ARGS] {",
    "whitespace_only": "\n \n",
    "unicode_text_before": f"Prüfe 東京…{TOKYO}",
}
PRE_V11_CALL = '[{"name": "get_weather", "arguments": {"city": "Paris"}}]'
PRE_V11_SAMPLES = {
    "single_call": f"[TOOL_CALLS]{PRE_V11_CALL}",
    "bare_object": '[TOOL_CALLS]{"name": "get_weather", "arguments": {"city": "Paris"}}',
    "parallel_calls": '[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}}, '
    '{"name": "b", "arguments": {"y": {"z": [1, "}"]}}}]',
    "text_before_call": f"Let me check. [TOOL_CALLS]{PRE_V11_CALL}",
    "text_after_call": f"[TOOL_CALLS]{PRE_V11_CALL} Done.",
    "spaces": '[TOOL_CALLS] [ {"name" : "f" , "arguments" : { "a" : 1 } } ]',
    "cut_off_mid_arguments": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Pa',
    "cut_off_in_name": '[TOOL_CALLS][{"name": "get_wea',
    "invalid_json": '[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}]',
    "garbage": "Hi [TOOL_CALLS]garbage",
    "string_arguments": '[TOOL_CALLS][{"name": "f", "arguments": "{\\"a\\": 1}"}]',
    "arguments_before_name": '[TOOL_CALLS][{"arguments": {"a": 1}, "name": "f"}]',
    "missing_name": '[TOOL_CALLS][{"arguments": {"a": 1}}]',
    "not_calls": "[TOOL_CALLS][1, 2]",
    "repeated_marker": f"[TOOL_CALLS][TOOL_CALLS]{PRE_V11_CALL}",
    "no_call": "The answer is 4 [1].",
    "unicode": '[TOOL_CALLS][{"name": "f", "arguments": {"q": "Tōkyō 東京 🙂"}}]',
}
REASONING_SAMPLES = {
    "reasoning_then_answer": "[THINK]Let me think.[/THINK]\n\nThe answer is 4.",
    "no_reasoning": "The answer is 4.",
    "never_closed": "[THINK]Let me think, and think again",
    "trailing_whitespace": "[THINK]a \n[/THINK] b",
    "empty_reasoning": "[THINK][/THINK]Answer",
    "reasoning_then_call": f"[THINK]Call it.[/THINK]\n\n{PARIS}",
    "call_inside_reasoning": f"[THINK]Call it.{PARIS}",
    "call_without_reasoning": f"Sure. {PARIS}",
    "content_before_reasoning": "Hi\n[THINK]x[/THINK]y",
    "whitespace_before_reasoning": "\n[THINK]x[/THINK]y",
    "stray_end": "a[/THINK]b",
    "second_start": "[THINK]a[THINK]b[/THINK]c",
    "second_end": "[THINK]a[/THINK]b[/THINK]c",
    "cut_off_at_bracket": "[THINK]think [",
    "unicode": "[THINK]考虑一下 é 🙂[/THINK]答案：✓",
}


def _comparable(out: Assembled) -> tuple:
    # Mistral's ids: 9 alphanumerics. vLLM may stream a call's pieces without ever sending its
    # id (pre-v11), so which calls got one is compared too.
    assert all(MISTRAL_ID_RE.fullmatch(i) for i in out.ids.values()), out.ids
    return out.reasoning, out.content, out.calls, set(out.ids)


def _splits(text: str, *, whole_markers: bool) -> list[list[str]]:
    """Token deltas, the whole text, every two-delta split. With ``whole_markers``, splits
    that cut a marker are left out: vLLM's engine reads markers by token id there, so a cut
    marker (no longer a special token) is text to vLLM, while a text-only parser sees it."""
    splits = two_delta_splits(text)
    if whole_markers:
        spans = [(m.start(), m.end()) for m in re.finditer("|".join(map(re.escape, MARKERS)), text)]
        splits = [s for s in splits if not any(a < len(s[0]) < b for a, b in spans)]
    return splits


def _check_tool_parser(make: type[ToolParser], text: str, tok, *, whole_markers: bool) -> None:
    _, content, calls = vllm_whole(text, tool="mistral", tok=tok)
    result = make().extract(text)
    assert result.tools_called == bool(calls)
    assert [(c.name, c.arguments) for c in result.tool_calls] == calls
    assert result.content == content
    assert all(MISTRAL_ID_RE.fullmatch(c.id) for c in result.tool_calls)
    for deltas in [token_deltas(text, tok), [text], *_splits(text, whole_markers=whole_markers)]:
        ours = our_stream(make(), deltas)
        expected = vllm_stream(deltas, tool="mistral", tok=tok)
        assert _comparable(ours) == _comparable(expected), deltas


@pytest.mark.parametrize("sample", V11_SAMPLES)
def test_v11_tool_parser_matches_vllm(sample: str) -> None:
    _check_tool_parser(MistralToolParser, V11_SAMPLES[sample], V11, whole_markers=True)


@pytest.mark.parametrize(
    "sample", ["single_call", "parallel_calls", "whitespace_before_call", "think_markers_as_text"]
)
def test_v11_tool_parser_matches_vllm_with_think_tokens(sample: str) -> None:
    # [THINK] in the vocabulary changes nothing for the tool parser alone: markers are text.
    _check_tool_parser(MistralToolParser, V11_SAMPLES[sample], V11_THINK, whole_markers=True)


@pytest.mark.parametrize("sample", PRE_V11_SAMPLES)
def test_pre_v11_tool_parser_matches_vllm(sample: str) -> None:
    # All splits: vLLM's pre-v11 path looks for the marker in each delta's text.
    _check_tool_parser(
        MistralPreV11ToolParser, PRE_V11_SAMPLES[sample], PRE_V11, whole_markers=False
    )


def test_schema_coercion_matches_vllm() -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "plan",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "days": {"type": "integer"},
                        "ratio": {"type": ["number", "null"]},
                        "flag": {"type": "boolean"},
                        "city": {"type": "string"},
                        "opts": {"type": "object", "properties": {"n": {"type": "integer"}}},
                        "tags": {"type": "array", "items": {"type": "integer"}},
                        "raw": {"type": "string"},
                    },
                },
            },
        }
    ]
    text = (
        '[TOOL_CALLS]plan[ARGS]{"days": "3", "ratio": "2.0", "flag": "true", "city": 5,'
        ' "opts": {"n": "7"}, "tags": ["1", 2], "raw": "x"}'
    )
    _, content, calls = vllm_whole(text, tool="mistral", tok=V11, tools=tools)
    result = MistralToolParser(tools=tools).extract(text)
    assert [(c.name, c.arguments) for c in result.tool_calls] == calls
    assert result.content == content
    # Nothing to coerce: the raw JSON text is kept, not re-serialised.
    raw = '[TOOL_CALLS]plan[ARGS]{"days":3}'
    _, _, calls = vllm_whole(raw, tool="mistral", tok=V11, tools=tools)
    result = MistralToolParser(tools=tools).extract(raw)
    assert [(c.name, c.arguments) for c in result.tool_calls] == calls == [("plan", '{"days":3}')]


@pytest.mark.parametrize("sample", REASONING_SAMPLES)
def test_reasoning_parser_matches_vllm(sample: str) -> None:
    text = REASONING_SAMPLES[sample]
    reasoning, content, _ = vllm_whole(text, reasoning="mistral", tok=V11_THINK)
    result = reasoning_parser("mistral").extract(text)
    assert (result.reasoning, result.content) == (reasoning, content)
    for deltas in [token_deltas(text, V11_THINK), [text], *_splits(text, whole_markers=True)]:
        ours = our_stream(reasoning_parser("mistral"), deltas)
        expected = vllm_stream(deltas, reasoning="mistral", tok=V11_THINK)
        assert _comparable(ours) == _comparable(expected), deltas


@pytest.mark.parametrize("text", ["[THINK]a[/THINK]b", "plain"])
def test_reasoning_parser_without_think_tokens_is_content(text: str) -> None:
    reasoning, content, _ = vllm_whole(text, reasoning="mistral", tok=V11)
    parser = MistralReasoningParser(think_tokens=False)
    assert parser.reasoning_ended
    assert (parser.extract(text).reasoning, parser.extract(text).content) == (reasoning, content)
    ours = our_stream(MistralReasoningParser(think_tokens=False), token_deltas(text, V11))
    expected = vllm_stream(token_deltas(text, V11), reasoning="mistral", tok=V11)
    assert _comparable(ours) == _comparable(expected)


COMBINED = [
    "reasoning_then_call",
    "call_inside_reasoning",
    "call_without_reasoning",
    "reasoning_then_answer",
    "never_closed",
]


@pytest.mark.parametrize(
    "text",
    [REASONING_SAMPLES[s] for s in COMBINED]
    + [f"[THINK]a[/THINK]{PARIS}[/THINK]", "[THINK]a[/THINK]b [/THINK]c[THINK]d"],
)
def test_reasoning_then_tools_matches_vllm(text: str) -> None:
    reasoning, content, calls = vllm_whole(text, tool="mistral", reasoning="mistral", tok=V11_THINK)
    split = reasoning_parser("mistral").extract(text)
    result = mistral_tool_parser(V11_THINK.get_vocab(), reasoning=True).extract(split.content or "")
    assert (split.reasoning, result.content) == (reasoning, content)
    assert [(c.name, c.arguments) for c in result.tool_calls] == calls
    for deltas in [token_deltas(text, V11_THINK), [text], *_splits(text, whole_markers=True)]:
        tools = mistral_tool_parser(V11_THINK.get_vocab(), reasoning=True)
        ours = ReasoningThenTools(reasoning_parser("mistral"), tools).run(deltas)
        expected = vllm_stream(deltas, tool="mistral", reasoning="mistral", tok=V11_THINK)
        assert _comparable(ours) == _comparable(expected), deltas


def test_vocabulary_picks_the_format() -> None:
    assert isinstance(mistral_tool_parser(PRE_V11.get_vocab()), MistralPreV11ToolParser)
    assert isinstance(mistral_tool_parser(V11.get_vocab()), MistralToolParser)
    assert isinstance(tool_parser("mistral"), MistralToolParser)
    assert isinstance(reasoning_parser("mistral"), MistralReasoningParser)


def test_streamed_call_pieces() -> None:
    parser = tool_parser("mistral")
    assert parser.feed("\n") is None  # whitespace waits: dropped if a call follows
    assert parser.feed("[TOOL_CALLS]get_weather") is None
    head = parser.feed('[ARGS]{"city": "Pa')
    assert head is not None and head.content is None and len(head.tool_calls) == 1
    piece = head.tool_calls[0]
    assert (piece.index, piece.name, piece.arguments) == (0, "get_weather", '{"city": "Pa')
    assert MISTRAL_ID_RE.fullmatch(piece.id or "")
    tail = parser.feed('ris"}')
    assert tail is not None and [c.arguments for c in tail.tool_calls] == ['ris"']
    end = parser.finish()  # the closing brace waited for the end
    assert end is not None and [c.arguments for c in end.tool_calls] == ["}"]


@pytest.mark.parametrize(
    "text",
    [
        "plain",
        "[THINK]a b",
        "[THINK]a[/THINK]b",
        "x[TOOL_CALLS]f[ARGS]{}",
        "[TOOL_CALLS]f[ARGS]{}[THINK]x y",
        "[THINK]a[THINK]b[/THINK]c[THINK]d e",
        "[THINK]a[TOOL_CALLS]f[ARGS]{}",
    ],
)
def test_prompt_end_and_reasoning_token_count_match_vllm(text: str) -> None:
    from vllm.parser.parser_manager import ParserManager

    ids = V11_THINK.encode(text)
    vllm = ParserManager.get_parser(reasoning_parser_name="mistral")(V11_THINK, None)
    texts = [V11_THINK.decode([i]) for i in ids]
    parser = reasoning_parser("mistral")
    assert parser.prompt_ends_reasoning(texts) == vllm.is_reasoning_end(ids)
    specials = V11_THINK.all_special_tokens
    assert parser.count_reasoning_tokens(texts, specials) == vllm.count_reasoning_tokens(ids)
    no_think = MistralReasoningParser(think_tokens=False)
    ids = V11.encode(text)
    vllm = ParserManager.get_parser(reasoning_parser_name="mistral")(V11, None)
    assert no_think.prompt_ends_reasoning([V11.decode([i]) for i in ids]) == vllm.is_reasoning_end(
        ids
    )
