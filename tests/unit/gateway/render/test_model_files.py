"""The model loader: what it reads, once, and where vLLM would read the same."""

from __future__ import annotations

import pytest

from gateway.render.model_files import ModelFiles


def test_reads_every_file_the_gateway_needs(vision_model):
    files = ModelFiles.load(vision_model)
    assert files.model_type == "qwen2_vl"
    assert files.generation_config["eos_token_id"] == [files.vocab["<|im_end|>"], 3000]
    assert files.special_tokens["eos_token"] == "<|im_end|>"
    assert files.vocab["<|image_pad|>"] == 3005 and "<|image_pad|>" in files.vocab
    assert files.added_tokens[3005] == "<|image_pad|>"
    assert files.preprocessor["max_pixels"] == 28 * 28 * 64
    assert files.templates.processor is not None
    with pytest.raises(KeyError):
        files.vocab["<not a token>"]
