"""Which processor serves a model dir: the first family whose `matches` accepts its files."""

from __future__ import annotations

import json
from pathlib import Path

from multimodal.processors.base import ImageProcessor, ModelFiles
from multimodal.processors.llava import LlavaProcessor
from multimodal.processors.llava_next import LlavaNextProcessor
from multimodal.processors.qwen_vl import QwenVLProcessor

FAMILIES: tuple[type[ImageProcessor], ...] = (QwenVLProcessor, LlavaProcessor, LlavaNextProcessor)


class UnsupportedModel(LookupError):
    pass


def read_model_files(model_dir: Path) -> ModelFiles:
    model_dir = Path(model_dir)
    config = _json(model_dir / "config.json")
    preprocessor = _json(model_dir / "preprocessor_config.json")
    if not preprocessor:
        # transformers 5 nests the image processor's settings in processor_config.json.
        preprocessor = _json(model_dir / "processor_config.json").get("image_processor", {})
    tokenizer = _json(model_dir / "tokenizer.json")
    vocab = dict(tokenizer.get("model", {}).get("vocab", {}))
    vocab.update({t["content"]: t["id"] for t in tokenizer.get("added_tokens", [])})
    return ModelFiles(config=config, preprocessor=preprocessor, vocab=vocab)


def processor_for(model_dir: Path) -> ImageProcessor:
    files = read_model_files(model_dir)
    for family in FAMILIES:
        if family.matches(files):
            return family.from_files(files)
    raise UnsupportedModel(
        f"no image processor for model_type {files.config.get('model_type')!r} in {model_dir}"
    )


def _json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}
