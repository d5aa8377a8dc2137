"""A DecodeStream primed with the prompt's tail (`priming_ids`) gives, step by step, the same
text as one primed with the whole prompt, which is what vLLM's detokenizer does."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from gateway.stream.detokenizer import PRIME_TOKENS, priming_ids
from tests.unit.gateway.render.test_segment_tokenizer import QUALIFYING, _metaspace, prompts


def _steps(tokenizer: Tokenizer, primed: list[int], out: list[int], skip: bool) -> list[str]:
    stream, texts = DecodeStream(ids=primed, skip_special_tokens=skip), []
    for token in out:
        try:
            texts.append(repr(stream.step(tokenizer, token)))
        except Exception as error:  # the invalid-prefix error must match too
            texts.append(f"error: {error}")
    return texts


def _cases(tokenizer: Tokenizer, seed: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, generated ids): prompts from text (whole characters) and from random ids
    (cut UTF-8 sequences, lone continuation bytes, specials anywhere), answers of random ids
    with byte tokens over-represented."""
    rng = random.Random(seed)
    vocab = tokenizer.get_vocab_size()
    added = [t.content for t in tokenizer.get_added_tokens_decoder().values()]
    texts = [t for t in prompts(added, count=120, seed=seed)]
    out = []
    for i, text in enumerate(texts):
        ids = tokenizer.encode(text * 4).ids
        if i % 2:
            ids = [rng.randrange(vocab) for _ in range(rng.randint(1, 120))]
        answer = [rng.randrange(vocab if rng.random() < 0.5 else 300) for _ in range(12)]
        out.append((ids, answer))
    return out


@pytest.mark.parametrize("name", sorted(QUALIFYING))
@pytest.mark.parametrize("skip", [True, False])
def test_tail_priming_gives_the_same_steps(name: str, skip: bool) -> None:
    tokenizer = QUALIFYING[name]()
    shortened = 0
    for prompt, answer in _cases(tokenizer, seed=len(name)):
        primed = priming_ids(tokenizer, prompt, skip)
        shortened += len(primed) < len(prompt)
        assert prompt[len(prompt) - len(primed) :] == primed
        expected = _steps(tokenizer, list(prompt), answer, skip)
        assert _steps(tokenizer, primed, answer, skip) == expected, (prompt, answer)
    if name not in ("metaspace-always", "bert"):  # byte-level decoders: the tail is used
        assert shortened > 20


def test_other_decoders_prime_with_the_whole_prompt() -> None:
    tokenizer = _metaspace("always")
    ids = tokenizer.encode("the quick brown fox " * 30).ids
    assert len(ids) > PRIME_TOKENS
    assert priming_ids(tokenizer, ids, True) == ids
