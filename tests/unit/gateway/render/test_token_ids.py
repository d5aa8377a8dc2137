"""`token_ids` (encode_batch_fast, no offsets) gives exactly `Tokenizer.encode(...).ids`."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from engine_server.tiny_models import ensure_model
from gateway.render.renderer import token_ids

TEXTS = (
    "",
    "hello world",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi  there\n\n<|im_end|>",
    "  leading and trailing spaces  \r\n",
    "unicode: café, naïve, 東京, emoji 🙂, combining e\u0301",
    "<|vision_start|><|image_pad|><|image_pad|><|vision_end|>describe",
    "the sea " * 300,
)


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(ensure_model("vision") / "tokenizer.json"))


@pytest.mark.parametrize("add_special_tokens", [False, True])
def test_token_ids_equal_encode(tokenizer: Tokenizer, add_special_tokens: bool) -> None:
    for text in TEXTS:
        expected = tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
        assert token_ids(tokenizer, text, add_special_tokens) == expected, text
