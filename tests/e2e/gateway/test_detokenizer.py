"""The gateway's detokenizer against vLLM's own output text for the same generations."""

from __future__ import annotations

import random

import pytest
from vllm import SamplingParams
from vllm.inputs.engine import tokens_input

from gateway.render.model_files import ModelFiles
from gateway.stream.detokenizer import IncrementalText, TextOptions

PROMPTS = [
    "def main():\n    return",
    "import os\n",
    "class A:\n    x = ",
    "# comment\n",
    # Longer than the tail a byte-level stream is primed with (detokenizer.PRIME_TOKENS),
    # with multi-byte characters on the way
    "# caf\u00e9 \u6771\u4eac \U0001f642 na\u00efve\n" * 6 + "def main():\n    return",
]


@pytest.fixture(scope="module")
def files(text_model) -> ModelFiles:
    return ModelFiles.load(text_model)


@pytest.fixture(scope="module")
def tokenizer(files):
    return files.tokenizer


def vllm_text(reference, ids, request_id: str, **params):
    out = reference.generate(
        tokens_input(ids), SamplingParams(temperature=0.0, max_tokens=40, **params), request_id
    ).outputs[0]
    return out


def ours(files, prompt_ids, output, options: TextOptions, seed: int) -> tuple[str, str]:
    """Feed vLLM's token ids in random chunks; returns (final text, concatenated deltas)."""
    text = IncrementalText(files.tokenizer, prompt_ids, options, files.added_tokens)
    ids = list(output.token_ids)
    stop_terminated = output.finish_reason == "stop" and isinstance(output.stop_reason, int)
    rng, streamed, position = random.Random(seed), [], 0
    while position < len(ids):
        step = ids[position : position + rng.randint(1, 4)]
        position += len(step)
        last = position >= len(ids)
        text.update(step, stop_terminated=stop_terminated and last)
        streamed.append(text.release(finished=last))
    return text.text, "".join(streamed)


def cases(tokenizer, reference):
    """(name, prompt ids, sampling kwargs) built from what the model actually generates."""
    out = []
    for i, prompt in enumerate(PROMPTS):
        ids = tokenizer.encode(prompt).ids
        free = vllm_text(reference, ids, f"free-{i}").text
        middle = free[len(free) // 3 : len(free) // 3 + 3]
        out += [
            (f"plain-{i}", ids, {}),
            (f"specials-{i}", ids, {"skip_special_tokens": False}),
            (
                f"no-spaces-{i}",
                ids,
                {"skip_special_tokens": False, "spaces_between_special_tokens": False},
            ),
            (f"stop-{i}", ids, {"stop": [middle]}),
            (f"stop-include-{i}", ids, {"stop": [middle], "include_stop_str_in_output": True}),
            (f"stop-late-{i}", ids, {"stop": [middle[:1]], "min_tokens": 10}),
            (f"stop-two-{i}", ids, {"stop": [free[-3:], middle[-1:]]}),
        ]
    return out


def test_text_equals_vllm_streaming_and_not(text_reference, files, tokenizer):
    checked = 0
    for name, ids, params in cases(tokenizer, text_reference):
        output = vllm_text(text_reference, ids, name, **params)
        options = TextOptions(
            skip_special_tokens=params.get("skip_special_tokens", True),
            spaces_between_special_tokens=params.get("spaces_between_special_tokens", True),
            stop=tuple(params.get("stop", ())),
            include_stop_str_in_output=params.get("include_stop_str_in_output", False),
            min_tokens=params.get("min_tokens", 0),
        )
        for seed in range(3):
            final, streamed = ours(files, ids, output, options, seed)
            assert final == output.text, (name, seed)
            assert streamed == output.text, (name, seed)
        checked += 1
    assert checked == len(PROMPTS) * 7


def test_stop_token_is_left_out_of_the_text(text_reference, files, tokenizer):
    ids = tokenizer.encode(PROMPTS[0]).ids
    free = vllm_text(text_reference, ids, "tok-free")
    stop_id = free.token_ids[6]
    for include in (False, True):
        output = vllm_text(
            text_reference,
            ids,
            f"tok-{include}",
            stop_token_ids=[stop_id],
            include_stop_str_in_output=include,
        )
        assert output.stop_reason == stop_id
        final, streamed = ours(
            files, ids, output, TextOptions(include_stop_str_in_output=include), 0
        )
        assert final == streamed == output.text


def test_stop_prefix_is_held_back_only_while_it_could_match(tokenizer):
    text = IncrementalText(tokenizer, [], TextOptions(stop=("STOP",)), {})
    text.update(tokenizer.encode("hello ST", add_special_tokens=False).ids)
    assert text.release(finished=False) == "hello "
    text.update(tokenizer.encode("X", add_special_tokens=False).ids)
    assert text.release(finished=False) == "STX"
