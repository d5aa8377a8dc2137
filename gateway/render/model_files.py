"""The model's files, read once: every part of the gateway that needs them takes a `ModelFiles`.

What is read, and where from (as transformers 5 and vLLM 0.32 read a model directory):
- `config.json` and `generation_config.json`;
- the tokenizer (`tokenizer.json`, parsed once) and `tokenizer_config.json`, with the named
  special tokens transformers hands every chat template (`special_tokens_map`), every named
  `*_token` its tokenizer has as an attribute (`named_tokens`: processors read some) and the
  added tokens marked special (`special_added_tokens`: parsers drop them);
- the chat templates: the tokenizer's (`chat_template.jinja`, `additional_chat_templates/`,
  else `tokenizer_config.json`'s string or list of named templates), for models that have an
  image or video processor AutoProcessor's (`processor_config.json`, the legacy
  `chat_template.json`, else `chat_template.jinja`), and vLLM's built-in fallback for the
  model_type (`fallback_templates/`), used when the model has none;
- the image and video processors' settings (`preprocessor_config.json` and
  `video_preprocessor_config.json`, or the `image_processor` and `video_processor` entries of
  transformers 5's `processor_config.json`).

It also satisfies `multimodal.processors.base.ModelConfigs`, what a model family reads.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

# Standard named special tokens transformers passes to every template (SPECIAL_TOKEN_ATTRIBUTES).
SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


@dataclass(frozen=True)
class ChatTemplates:
    """The templates transformers would load for the model's tokenizer and processor."""

    tokenizer: str | dict[str, str] | None  # a dict when the tokenizer has named templates
    processor: str | None  # AutoProcessor's, for models that have a processor
    fallback: str | None = None  # vLLM's built-in template for the model_type


@dataclass(frozen=True, eq=False)
class ModelFiles:
    path: Path
    config: Mapping[str, Any]
    generation_config: Mapping[str, Any]
    tokenizer: Tokenizer
    tokenizer_config: Mapping[str, Any]
    special_tokens: Mapping[str, str]  # e.g. {"eos_token": "<|im_end|>"}: template variables
    named_tokens: Mapping[str, str]  # the tokenizer's `*_token` attributes, e.g. image_token
    templates: ChatTemplates
    preprocessor: Mapping[str, Any]  # the image processor's settings
    video_preprocessor: Mapping[str, Any]  # the video processor's, for models that take video
    # The audio feature extractor's, for models that take audio (Qwen2-Audio's
    # WhisperFeatureExtractor): preprocessor_config.json, or processor_config.json's entry.
    audio_preprocessor: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> ModelFiles:
        path = Path(path)
        tokenizer_config = _json(path / "tokenizer_config.json")
        config = _json(path / "config.json")
        return cls(
            path=path,
            config=config,
            generation_config=_json(path / "generation_config.json"),
            tokenizer=Tokenizer.from_file(str(path / "tokenizer.json")),
            tokenizer_config=tokenizer_config,
            special_tokens=_special_tokens(path, tokenizer_config),
            named_tokens=tokenizer_named_tokens(tokenizer_config),
            templates=ChatTemplates(
                _tokenizer_templates(path, tokenizer_config),
                _processor_template(path),
                fallback_template(config.get("model_type"), str(path)),
            ),
            preprocessor=_processor_config(path, "preprocessor_config.json", "image_processor"),
            video_preprocessor=_processor_config(
                path, "video_preprocessor_config.json", "video_processor"
            ),
            audio_preprocessor=_processor_config(
                path, "preprocessor_config.json", "feature_extractor"
            ),
        )

    @property
    def model_type(self) -> str | None:
        return self.config.get("model_type")

    @functools.cached_property
    def vocab(self) -> Mapping[str, int]:
        """Token text -> id, added tokens included (looked up in the tokenizer, not copied)."""
        return _Vocab(self.tokenizer)

    @functools.cached_property
    def added_tokens(self) -> dict[int, str]:
        decoder = self.tokenizer.get_added_tokens_decoder()
        return {tid: token.content for tid, token in decoder.items()}

    @functools.cached_property
    def special_added_tokens(self) -> frozenset[str]:
        """The added tokens marked special: what vLLM drops from the text parsers see."""
        decoder = self.tokenizer.get_added_tokens_decoder()
        return frozenset(token.content for token in decoder.values() if token.special)

    @property
    def clean_up_spaces(self) -> bool:
        """transformers' clean_up_tokenization_spaces, applied when vLLM decodes a prompt."""
        return bool(self.tokenizer_config.get("clean_up_tokenization_spaces", False))


def is_model_dir(path: Path) -> bool:
    return (Path(path) / "tokenizer.json").is_file()


class _Vocab(Mapping[str, int]):
    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer

    def __getitem__(self, token: str) -> int:
        token_id = self._tokenizer.token_to_id(token)
        if token_id is None:
            raise KeyError(token)
        return token_id

    def __iter__(self) -> Iterator[str]:
        return iter(self._tokenizer.get_vocab(with_added_tokens=True))

    def __len__(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)


# vLLM's _MODEL_TYPE_TO_CHAT_TEMPLATE_FALLBACK (vllm/transformers_utils/chat_templates).
_FALLBACKS = {
    "blip-2": "blip2",
    "clip": "basic",
    "colpali": "basic",
    "deepseek_ocr": "deepseek_ocr",
    "deepseek_ocr2": "deepseek_ocr",
    "unlimited-ocr": "deepseek_ocr",
    "unlimited_ocr": "deepseek_ocr",
    "deepseek_vl_v2": "deepseek_vl2",
    "minicpmv": "minicpmv",
    "minicpmv4_6": "minicpmv",
    "minicpmv4_7": "minicpmv",
    "paligemma": "basic",
    "siglip": "basic",
    "siglip2": "basic",
}
_FALLBACK_DIR = Path(__file__).parent / "fallback_templates"


def fallback_template(model_type: str | None, name_or_path: str) -> str | None:
    """vLLM's built-in chat template for a model_type that ships none (its 4th choice)."""
    name = _FALLBACKS.get(model_type or "")
    if name == "minicpmv":  # MiniCPM-V 4.5 has its own; the other versions take ChatML
        name = "minicpmv45" if "4.5" in name_or_path or "4_5" in name_or_path else "chatml"
    return (_FALLBACK_DIR / f"{name}.jinja").read_text(encoding="utf-8") if name else None


def _tokenizer_templates(path: Path, tokenizer_config: Mapping[str, Any]) -> Any:
    # transformers 5: chat_template.jinja and additional_chat_templates/*.jinja replace
    # tokenizer_config.json's "chat_template" (a string or a list of named templates).
    named = {}
    default = path / "chat_template.jinja"
    if default.is_file():
        named["default"] = default.read_text(encoding="utf-8")
    extra = path / "additional_chat_templates"
    if extra.is_dir():
        for file in sorted(extra.glob("*.jinja")):
            named[file.name.removesuffix(".jinja")] = file.read_text(encoding="utf-8")
    if not named:
        value = tokenizer_config.get("chat_template")
        if isinstance(value, list):
            named = {t["name"]: t["template"] for t in value}
        elif isinstance(value, str):
            return value
    if list(named) == ["default"]:
        return named["default"]
    return named or None


def _processor_template(path: Path) -> str | None:
    # Only models with a processor (an image/video preprocessor) get AutoProcessor's template.
    config = _json(path / "processor_config.json")
    if not config and not (path / "preprocessor_config.json").is_file():
        return None
    if isinstance(config.get("chat_template"), str):
        return config["chat_template"]
    legacy = _json(path / "chat_template.json").get("chat_template")
    if isinstance(legacy, str):
        return legacy
    jinja_file = path / "chat_template.jinja"
    return jinja_file.read_text(encoding="utf-8") if jinja_file.is_file() else None


def _special_tokens(path: Path, config: Mapping[str, Any]) -> dict[str, str]:
    """transformers' `tokenizer.special_tokens_map`: named special tokens as strings."""
    values: dict[str, Any] = {k: config.get(k) for k in SPECIAL_TOKEN_NAMES}
    extra = config.get("extra_special_tokens")
    if isinstance(extra, dict):  # model-specific named tokens, e.g. {"image_token": "<image>"}
        values.update(extra)
    if "added_tokens_decoder" not in config:
        # Legacy layout: special_tokens_map.json overrides the config's entries.
        for key, value in _json(path / "special_tokens_map.json").items():
            if key in SPECIAL_TOKEN_NAMES or (isinstance(extra, dict) and key in extra):
                values[key] = value
    return {k: s for k, v in values.items() if (s := _token_text(v)) is not None}


def tokenizer_named_tokens(tokenizer_config: Mapping[str, Any]) -> dict[str, str]:
    """A transformers tokenizer's named model-specific tokens, from its config: every
    top-level `*_token` string (what transformers 5 writes, and reads back as attributes),
    then the `extra_special_tokens` mapping (the other layout it reads)."""
    extra = tokenizer_config.get("extra_special_tokens")
    pairs = [*tokenizer_config.items(), *(extra.items() if isinstance(extra, Mapping) else ())]
    return {k: t for k, v in pairs if k.endswith("_token") and (t := _token_text(v)) is not None}


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):  # a serialized AddedToken
        value = value.get("content")
    return value if isinstance(value, str) else None


def _processor_config(path: Path, file_name: str, key: str) -> dict[str, Any]:
    config = _json(path / file_name)
    if not config:
        # transformers 5 nests the processors' settings in processor_config.json.
        config = _json(path / "processor_config.json").get(key, {})
    return config


def _json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
