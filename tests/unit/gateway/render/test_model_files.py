"""The model loader: what it reads, once, and where vLLM would read the same."""

from __future__ import annotations

import json
import shutil

import pytest

from gateway.render.model_files import ModelFiles, fallback_template
from gateway.render.templates import select_template


def test_reads_every_file_the_gateway_needs(vision_model):
    files = ModelFiles.load(vision_model)
    assert files.model_type == "qwen2_vl"
    assert files.generation_config["eos_token_id"] == [files.vocab["<|im_end|>"], 3000]
    assert files.special_tokens["eos_token"] == "<|im_end|>"
    assert files.vocab["<|image_pad|>"] == 3005 and "<|image_pad|>" in files.vocab
    assert files.added_tokens[3005] == "<|image_pad|>"
    assert files.preprocessor["max_pixels"] == 28 * 28 * 64
    assert files.video_preprocessor["video_processor_type"] == "Qwen2VLVideoProcessor"
    assert files.templates.processor is not None and files.templates.fallback is None
    with pytest.raises(KeyError):
        files.vocab["<not a token>"]


def test_fallback_templates_are_vllms():
    from vllm.transformers_utils.chat_templates import registry

    names = {"minicpmv": ["openbmb/MiniCPM-V-4_5", "openbmb/MiniCPM-V-2_6"]}
    for model_type in registry._MODEL_TYPE_TO_CHAT_TEMPLATE_FALLBACK:
        for name in names.get(model_type.split("4_")[0], ["some/model"]):
            path = registry.get_chat_template_fallback_path(model_type, name)
            assert fallback_template(model_type, name) == path.read_text(), (model_type, name)
    assert fallback_template("qwen2_vl", "x") is None


def test_a_model_without_a_template_gets_vllms_fallback(text_model, tmp_path):
    path = tmp_path / "paligemma-like"
    shutil.copytree(text_model, path)
    (path / "chat_template.jinja").unlink(missing_ok=True)
    tokenizer_config = json.loads((path / "tokenizer_config.json").read_text())
    tokenizer_config.pop("chat_template")
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "model_type": "paligemma"}))
    files = ModelFiles.load(path)
    assert files.templates.tokenizer is None
    assert select_template(files.templates, None, None) == fallback_template("paligemma", "")
