"""The one interface every model family implements; everything model-specific lives behind it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np


class OptionError(ValueError):
    """A per-request processor option (mm_processor_kwargs) the family does not accept."""


@dataclass
class ProcessedImages:
    """Model-ready tensors for a batch of images, in the layout the engine needs."""

    tensors: dict[str, np.ndarray]  # wire name -> array; the encoder input under "pixel_values"
    batched_keys: tuple[str, ...] = ()
    flat_keys: dict[str, str] = field(default_factory=dict)  # tensor -> its per-item sizes tensor
    keep_on_cpu_keys: tuple[str, ...] = ()
    replacements: list[list[int]] = field(default_factory=list)  # per image: its anchor's ids
    embed_token_id: int | None = None  # set when replacements hold non-embedding tokens


@dataclass(frozen=True)
class ModelFiles:
    """What a processor may read from a model dir: config.json, preprocessor config, vocab."""

    config: Mapping[str, Any]
    preprocessor: Mapping[str, Any]
    vocab: Mapping[str, int]


class ImageProcessor(ABC):
    family: ClassVar[str]
    # What vLLM's model class (get_placeholder_str) puts in a "string"-format chat prompt per
    # image; the tokens the chat template itself writes may differ.
    placeholder_text: ClassVar[str]

    @classmethod
    @abstractmethod
    def matches(cls, files: ModelFiles) -> bool: ...

    @classmethod
    @abstractmethod
    def from_files(cls, files: ModelFiles) -> ImageProcessor: ...

    @property
    @abstractmethod
    def anchor_token_id(self) -> int:
        """The token the model's chat template emits once per image."""

    @abstractmethod
    def resolve_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """Validated per-request options merged over the model's defaults."""

    @abstractmethod
    def process(
        self, images: Sequence[np.ndarray], options: Mapping[str, Any], raw_pixels: bool
    ) -> ProcessedImages:
        """HxWx3 uint8 RGB arrays to tensors; `raw_pixels` keeps uint8 for on-device normalize."""
