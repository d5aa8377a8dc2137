"""`SegmentTokenizer.encode` gives exactly `Tokenizer.encode(...).ids`, cache hit or miss, for
every tokenizer the tests build and for the added-token kinds that real models ship."""

from __future__ import annotations

import random
import re
from collections.abc import Callable

import pytest
from tokenizers import (
    AddedToken,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from engine_server import tiny_models as tm
from engine_server.tiny_models import base_tokenizer, ensure_model
from gateway.render.segment_tokenizer import SegmentTokenizer
from tests.support import (
    fallback_models,
    gemma3_models,
    gemma4_models,
    glm4v_models,
    idefics3_models,
    internvl_models,
    kimi_k25_models,
    llama4_models,
    llava_models,
    llava_onevision_models,
    pixtral_models,
    qwen3_tools_model,
)

WORDS = (
    "hello", "world", "The", " quick", "brown", "fox", "def", "return", "self", "x=1",
    "café", "naïve", "東京", "🙂", "e\u0301", "مرحبا", "Ωμέγα", "12345", "3.14", "...",
    "'s", "'ll", "{\"a\": [1, 2]}", "system", "user", "assistant", "<", ">", "|", "<|", "|>",
    "<tool_call>", "</", "[INST]", "▁", "\u00a0", "\ufeff",
)  # fmt: skip
SPACES = (" ", "  ", "   ", "\n", "\n\n", "\n\n\n\n\n", "\t", "\r\n", " \n ", "\u3000", "")


def _fragments(added: list[str]) -> list[str]:
    partial = [t[:k] for t in added for k in range(1, len(t)) if len(t) > 1]
    return [*WORDS, *SPACES, *added, *added, *partial]


def prompts(added: list[str], count: int = 250, seed: int = 0) -> list[str]:
    """Random texts with added tokens (adjacent, at either end, repeated), cut-off tokens such
    as "<|im_", unicode and whitespace runs on both sides of tokens; some recur whole, as a
    chat's history does."""
    rng = random.Random(seed)
    fragments = _fragments(added)
    out = ["", " ", "\n", *added, "".join(added), " ".join(added)]
    while len(out) < count:
        if out and rng.random() < 0.2:  # a later turn: an earlier prompt plus more
            out.append(rng.choice(out) + "".join(rng.choices(fragments, k=rng.randint(1, 8))))
        else:
            out.append("".join(rng.choices(fragments, k=rng.randint(0, 40))))
    return out


def _added(tokenizer: Tokenizer) -> list[str]:
    return [t.content for t in tokenizer.get_added_tokens_decoder().values()]


def _with_added(specials: tuple[str, ...], plain: tuple[str, ...] = ()) -> Tokenizer:
    tok = base_tokenizer(specials)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in plain])
    return tok


def _bert() -> Tokenizer:
    tok = base_tokenizer(tm.BERT_SPECIAL_TOKENS)
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)]
    )
    return tok


def _metaspace(prepend_scheme: str) -> Tokenizer:
    """Llama-2/Mistral style: Metaspace pre-tokenizer, a normalized added token (matched after
    normalization, inside a piece) next to non-normalized ones, overlapping token prefixes."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme=prepend_scheme)
    tok.decoder = decoders.Metaspace(prepend_scheme=prepend_scheme)
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<unk>"],
        initial_alphabet=[f"<0x{b:02X}>" for b in range(256)],
        show_progress=False,
    )
    tok.train_from_iterator([" ".join(WORDS) * 3, "the quick brown fox jumps over"], trainer)
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in ("<s>", "</s>", "[INST]")]
    )
    tok.add_tokens(
        [
            AddedToken("[/INST]", special=False, normalized=True),
            AddedToken("<|im", special=False, normalized=False),
            AddedToken("<|im_start|>", special=True, normalized=False),
            # Normalized tokens act inside a piece, where the library applies lstrip itself.
            AddedToken("<mask>", special=True, normalized=True, lstrip=True),
        ]
    )
    return tok


def _from_file(kind: str) -> Callable[[], Tokenizer]:
    return lambda: Tokenizer.from_file(str(ensure_model(kind) / "tokenizer.json"))


QUALIFYING: dict[str, Callable[[], Tokenizer]] = {
    "qwen-text-file": _from_file("text"),
    "qwen-vision-file": _from_file("vision"),
    "qwen3-tools": lambda: _with_added(tm.QWEN_SPECIAL_TOKENS, qwen3_tools_model.MARKERS),
    "gemma3": lambda: _with_added(gemma3_models.SPECIAL_TOKENS, gemma3_models.NEWLINES),
    "gemma4": lambda: _with_added(gemma4_models.SPECIAL_TOKENS),
    "glm4v": lambda: _with_added(glm4v_models.SPECIAL_TOKENS),
    "idefics3": lambda: _with_added(
        (*idefics3_models.IDEFICS3.text_specials, *idefics3_models.IMAGE_SPECIALS)
    ),
    "smolvlm": lambda: _with_added(
        (*idefics3_models.SMOLVLM.text_specials, *idefics3_models.IMAGE_SPECIALS)
    ),
    "internvl": lambda: _with_added(internvl_models.SPECIAL_TOKENS),
    "kimi-k25": lambda: _with_added(kimi_k25_models.SPECIAL_TOKENS),
    "llama4": lambda: _with_added(llama4_models.SPECIAL_TOKENS),
    "llava": lambda: _with_added(("<s>", "</s>", "<pad>", llava_models.IMAGE)),
    "llava-onevision": lambda: _with_added(llava_onevision_models.SPECIAL_TOKENS),
    "pixtral": lambda: _with_added(pixtral_models.SPECIAL_TOKENS),
    "fallback": lambda: _with_added(fallback_models.SPECIAL_TOKENS),
    "bert": _bert,
    "metaspace-always": lambda: _metaspace("always"),
}


def _check(tokenizer: Tokenizer, segments: SegmentTokenizer, add_special_tokens: bool) -> None:
    for text in prompts(_added(tokenizer)):
        expected = tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
        assert segments.encode(text, add_special_tokens) == expected, repr(text)


@pytest.mark.parametrize("name", sorted(QUALIFYING))
def test_equals_encode(name: str) -> None:
    tokenizer = QUALIFYING[name]()
    segments = SegmentTokenizer(tokenizer)
    assert segments.qualifies, segments.reason
    for add_special_tokens in (False, True):
        _check(tokenizer, segments, add_special_tokens)  # misses, then mostly hits
        _check(tokenizer, segments, add_special_tokens)  # every piece cached
    assert segments.cache_info()[0] > 0


def test_eviction_keeps_ids_exact() -> None:
    tokenizer = QUALIFYING["qwen3-tools"]()
    segments = SegmentTokenizer(tokenizer, max_entries=8, max_chars=400)
    _check(tokenizer, segments, False)
    entries, chars = segments.cache_info()
    assert entries <= 8 and chars <= 400


def test_longest_added_token_wins() -> None:
    # "\n\n\n" is one added token in gemma3, not "\n\n" then "\n".
    tokenizer = QUALIFYING["gemma3"]()
    text = "a\n\n\nb\n\n\n\n\n"
    ids = SegmentTokenizer(tokenizer).encode(text)
    assert ids == tokenizer.encode(text).ids
    assert tokenizer.token_to_id("\n\n\n") in ids


def _lstrip() -> Tokenizer:
    tok = _with_added(tm.QWEN_SPECIAL_TOKENS)
    tok.add_special_tokens([AddedToken("<mask>", special=True, normalized=False, lstrip=True)])
    return tok


def _single_word() -> Tokenizer:
    tok = _with_added(tm.QWEN_SPECIAL_TOKENS)
    tok.add_tokens([AddedToken("qqz", special=False, normalized=False, single_word=True)])
    return tok


def _encode_special_tokens() -> Tokenizer:
    tok = _with_added(tm.QWEN_SPECIAL_TOKENS)
    tok.encode_special_tokens = True
    return tok


def _truncated() -> Tokenizer:
    tok = _with_added(tm.QWEN_SPECIAL_TOKENS)
    tok.enable_truncation(16)
    return tok


DISQUALIFIED: dict[str, Callable[[], Tokenizer]] = {
    "lstrip": _lstrip,
    "single-word": _single_word,
    "metaspace-first": lambda: _metaspace("first"),
    "encode-special-tokens": _encode_special_tokens,
    "truncation": _truncated,
}


@pytest.mark.parametrize("name", sorted(DISQUALIFIED))
def test_disqualified_tokenizer_falls_back(name: str) -> None:
    tokenizer = DISQUALIFIED[name]()
    segments = SegmentTokenizer(tokenizer)
    assert not segments.qualifies
    for add_special_tokens in (False, True):
        _check(tokenizer, segments, add_special_tokens)
    assert segments.cache_info() == (0, 0)


def test_pieces_would_differ_where_disqualified() -> None:
    """The checks guard real differences: piecewise encoding is wrong for these tokenizers."""
    for name, text in (
        ("lstrip", "x  <mask> y"),
        ("metaspace-first", "<s>hello world"),
        ("single-word", "qqz aqqz"),
    ):
        tokenizer = DISQUALIFIED[name]()
        whole = tokenizer.encode(text, add_special_tokens=False).ids
        assert whole != _naive_pieces(tokenizer, text), name


def _naive_pieces(tokenizer: Tokenizer, text: str) -> list[int]:
    """Split at every non-normalized added token, ignoring its flags, encode pieces alone."""
    added = sorted(
        (t.content for t in tokenizer.get_added_tokens_decoder().values() if not t.normalized),
        key=len,
        reverse=True,
    )
    parts = re.split("(" + "|".join(map(re.escape, added)) + ")", text)
    return [i for p in parts if p for i in tokenizer.encode(p, add_special_tokens=False).ids]


def test_post_processor_that_adds_ids_falls_back_only_with_special_tokens() -> None:
    tokenizer = _bert()
    segments = SegmentTokenizer(tokenizer)
    text = "[CLS] hi [SEP] there"
    assert segments.encode(text, True) == tokenizer.encode(text).ids
    assert segments.cache_info() == (0, 0)  # add_special_tokens=True: the plain call
    assert segments.encode(text, False) == tokenizer.encode(text, add_special_tokens=False).ids
    assert segments.cache_info()[0] == 2  # " hi ", " there"
