"""The one byte-level BPE every tiny model shares, and the ways tests wrap it.

No model hub is reachable, so the vocabulary is trained here, on a fixed set of Python stdlib
sources; each model family then appends its own special tokens.
"""

from __future__ import annotations

import functools
import sysconfig
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# 3000 merged symbols keep embeddings tiny while still tokenising English/code
# into multi-byte pieces, so prompts of a few hundred chars stay short.
_BPE_VOCAB = 3000

# A fixed, sorted stdlib subset: ~0.9 MB of code+docstrings trains in well
# under a second. Alternatives cover stdlib renames across Python versions; the vocab
# always reaches _BPE_VOCAB, so special-token ids do not depend on the version.
_CORPUS_FILES: tuple[tuple[str, ...], ...] = (
    ("argparse.py",),
    ("ast.py",),
    ("base64.py",),
    ("calendar.py",),
    ("collections/__init__.py",),
    ("dataclasses.py",),
    ("difflib.py",),
    ("email/message.py",),
    ("enum.py",),
    ("functools.py",),
    ("json/decoder.py",),
    ("json/encoder.py",),
    ("logging/__init__.py",),
    ("pathlib.py", "pathlib/_local.py"),
    ("string.py",),
    ("textwrap.py",),
    ("typing.py",),
)

# Qwen2's pre-tokenizer split: keeps our token boundaries Qwen-like.
_QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _corpus() -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = []
    for candidates in _CORPUS_FILES:
        path = next((stdlib / c for c in candidates if (stdlib / c).is_file()), None)
        if path is not None:
            texts.append(path.read_text(encoding="utf-8"))
    if not texts:
        raise RuntimeError(f"no training text found under {stdlib}")
    return texts


@functools.lru_cache(maxsize=1)
def _bpe_json() -> str:
    """Train the shared BPE once per process; JSON so callers get fresh copies."""
    from tokenizers import (
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=_BPE_VOCAB,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return tok.to_str()


def base_tokenizer(special_tokens: Iterable[str]) -> Any:
    """A fresh `tokenizers.Tokenizer` of the shared BPE with `special_tokens` appended, in
    order, after the learned vocabulary (as Qwen does), so their ids are stable."""
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_str(_bpe_json())
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special_tokens])
    return tok


def fast_tokenizer(special_tokens: Iterable[str], **settings: Any) -> Any:
    """`base_tokenizer(special_tokens)` as a transformers `PreTrainedTokenizerFast`; `settings`
    are its arguments (the named tokens, chat_template, model_max_length, ...). Decoding never
    "cleans up" spaces, so text round-trips exactly."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=base_tokenizer(special_tokens),
        **settings,
        clean_up_tokenization_spaces=False,
    )


def token_ids(tokenizer: Any, tokens: Iterable[str]) -> dict[str, int]:
    """Each of `tokens` with its id in `tokenizer` (a transformers tokenizer)."""
    return {t: tokenizer.convert_tokens_to_ids(t) for t in tokens}
