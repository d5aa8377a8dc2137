"""pythonic and llama4_pythonic tool parsers against vLLM 0.32's, whole and streamed."""

from __future__ import annotations

import random

import pytest

from gateway.parsers import tool_parser
from gateway.parsers.pythonic_tool import _TOOL_CALL_RE
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

PARIS = "get_weather(city='Paris')"
TOKYO = 'get_weather(city="Tōkyō 東京 🙂")'
SAMPLES = {
    "single_call": f"[{PARIS}]",
    "parallel_calls": f"[{PARIS}, {TOKYO}]",
    "no_arguments": "[get_time()]",
    "no_arguments_then_call": f"[get_time(), {PARIS}]",
    "literals": "[f(a={'b': [1, 2.5, None]}, c=True, d=-3, e=(1, 2), g=null, h=f'x')]",
    "quotes_and_brackets": "[f(q='a]b)c', r=\"it's\", s='say \"hi\"')]",
    "escaped_quote": "[f(q='a\\'b', r='c\\\\')]",
    "dotted_name": "[tools.search(q='x')]",
    "text_before_call": f"Sure: [{PARIS}]",
    "text_after_call": f"[{PARIS}]\nDone.",
    "text_after_still_python": f"[{PARIS}]\nDone",
    "cut_off_mid_arguments": "[get_weather(city='Par",
    "cut_off_after_comma": f"[{PARIS}, ",
    "cut_off_in_name": "[get_wea",
    "cut_off_mid_dict": "[f(a={'k': 1, 'l",
    "positional_argument": "[f(1)]",
    "not_calls": "[1, 2, 3]",
    "empty_list": "[]",
    "citation": "[1] says so.",
    "reserved_keyword": "[f(from=1)]",
    "expression_argument": "[f(a=1 + 2)]",
    "no_call": "The answer is 4.",
    "unicode_text": "Prüfe 東京…",
}
LLAMA4_SAMPLES = {
    **SAMPLES,
    "python_markers": f"<|python_start|>[{PARIS}, {TOKYO}]<|python_end|>",
    "python_start_only": f"<|python_start|>[{PARIS}]",
    "python_markers_text_after": f"<|python_start|>[{PARIS}]<|python_end|>Done.",
    "python_markers_not_calls": "<|python_start|>print('hi')<|python_end|>",
}
LLAMA4_TOK = tokenizer((), ("<|python_start|>", "<|python_end|>"))
CASES = [("pythonic", s, SAMPLES[s]) for s in SAMPLES] + [
    ("llama4_pythonic", s, LLAMA4_SAMPLES[s]) for s in LLAMA4_SAMPLES
]


def _tok(name: str):
    return LLAMA4_TOK if name == "llama4_pythonic" else tokenizer()


def _comparable(out: Assembled) -> tuple:
    # vLLM may send a call's head twice (its arguments were empty): ids are compared per call.
    assert all(TOOL_ID_RE.fullmatch(i) for i in out.ids.values()), out.ids
    return out.reasoning, out.content, out.calls, set(out.ids)


@pytest.mark.parametrize(("name", "sample", "text"), CASES, ids=[f"{n}-{s}" for n, s, _ in CASES])
def test_whole_output_matches_vllm(name: str, sample: str, text: str) -> None:
    _, content, calls = vllm_whole(text, tool=name, tok=_tok(name))
    result = tool_parser(name).extract(text)
    assert result.tools_called == bool(calls)
    assert [(c.name, c.arguments) for c in result.tool_calls] == calls
    assert result.content == content
    assert all(TOOL_ID_RE.fullmatch(c.id) and c.type == "function" for c in result.tool_calls)


@pytest.mark.parametrize(("name", "sample", "text"), CASES, ids=[f"{n}-{s}" for n, s, _ in CASES])
def test_streaming_matches_vllm(name: str, sample: str, text: str) -> None:
    tok = _tok(name)
    # All splits, those cutting <|python_start|> too: vLLM decides by the text so far here.
    for deltas in [token_deltas(text, tok), [text], *two_delta_splits(text)]:
        ours = our_stream(tool_parser(name), deltas)
        expected = vllm_stream(deltas, tool=name, tok=tok)
        assert _comparable(ours) == _comparable(expected), deltas


def test_call_regex_accepts_what_vllms_accepts() -> None:
    from vllm.tool_parsers.pythonic_tool_parser import PythonicToolParser

    vllm_re = PythonicToolParser.TOOL_CALL_REGEX
    rng = random.Random(7)
    pieces = ["[", "]", "(", ")", "f", "g1", "a", "=", "1", ",", " ", "\n", "'", "x.y", "é"]
    texts = ["".join(rng.choices(pieces, k=rng.randint(1, 14))) for _ in range(4000)]
    texts += ["[" + "".join(rng.choices(pieces[2:], k=rng.randint(1, 14))) for _ in range(4000)]
    for text in texts:
        try:
            expected = vllm_re.match(text, timeout=1) is not None
        except TimeoutError:
            continue
        assert (_TOOL_CALL_RE.match(text) is not None) == expected, text


def test_streamed_call_pieces() -> None:
    parser = tool_parser("pythonic")
    assert parser.feed("[get_weather(") is None  # no argument name yet
    head = parser.feed("city='Pa")
    assert head is not None and len(head.tool_calls) == 1
    first = head.tool_calls[0]
    assert (first.index, first.name, first.arguments) == (0, "get_weather", '{"city": "Pa')
    rest = parser.feed("ris')]")
    assert rest is not None and [c.arguments for c in rest.tool_calls] == ['ris"}']
    assert parser.finish() is None
