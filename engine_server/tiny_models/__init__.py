"""Deterministic tiny random-weight models that real vLLM (CPU) can load: the kit the demo
(`mmgate demo`, `engine_server` without --model) and the tests build their models with.

Tests and demos need real engines but no model hub is reachable, so we train a
small byte-level BPE on Python stdlib sources and save random-weight checkpoints
in exactly the on-disk layout HF/vLLM expect (Qwen2, Qwen2-VL, BERT).

- `tokenizer`: the shared BPE (base_tokenizer, fast_tokenizer, token_ids).
- `files`: writing a model directory (seeded_model, save_model, write_json,
  patch_tokenizer_files, save_tokenizer, save_processor).
- `qwen`, `bert`, `chat_templates`: the three named models and their reusable pieces.
- `cache`: the named models by kind (KINDS), built once into a cache (ensure_model).

Everything public is importable from this package. Heavy dependencies (torch, transformers,
tokenizers) are imported lazily so that importing it stays cheap for processes that only need
cached paths.
"""

from engine_server.tiny_models.bert import (
    BERT_SPECIAL_TOKENS,
    bert_tokenizer,
    build_embedding_model,
)
from engine_server.tiny_models.cache import BUILD_VERSION, KINDS, default_cache_root, ensure_model
from engine_server.tiny_models.chat_templates import QWEN2_CHAT_TEMPLATE, QWEN2_VL_CHAT_TEMPLATE
from engine_server.tiny_models.files import (
    SEED,
    patch_tokenizer_files,
    save_model,
    save_processor,
    save_tokenizer,
    seeded_model,
    write_json,
)
from engine_server.tiny_models.qwen import (
    ENDOFTEXT,
    IM_END,
    IM_START,
    IMAGE_PAD,
    MAX_PIXELS,
    MIN_PIXELS,
    QWEN_SPECIAL_TOKENS,
    TEXT_DIMS,
    VIDEO_PAD,
    VISION_END,
    VISION_START,
    build_text_model,
    build_vision_model,
    qwen_tokenizer,
    save_decoder,
    text_config_kwargs,
)
from engine_server.tiny_models.tokenizer import base_tokenizer, fast_tokenizer, token_ids

__all__ = [
    "BERT_SPECIAL_TOKENS",
    "BUILD_VERSION",
    "ENDOFTEXT",
    "IMAGE_PAD",
    "IM_END",
    "IM_START",
    "KINDS",
    "MAX_PIXELS",
    "MIN_PIXELS",
    "QWEN2_CHAT_TEMPLATE",
    "QWEN2_VL_CHAT_TEMPLATE",
    "QWEN_SPECIAL_TOKENS",
    "SEED",
    "TEXT_DIMS",
    "VIDEO_PAD",
    "VISION_END",
    "VISION_START",
    "base_tokenizer",
    "bert_tokenizer",
    "build_embedding_model",
    "build_text_model",
    "build_vision_model",
    "default_cache_root",
    "ensure_model",
    "fast_tokenizer",
    "patch_tokenizer_files",
    "qwen_tokenizer",
    "save_decoder",
    "save_model",
    "save_processor",
    "save_tokenizer",
    "seeded_model",
    "text_config_kwargs",
    "token_ids",
    "write_json",
]
