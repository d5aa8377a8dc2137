"""The one interface every model family implements; everything model-specific lives behind it.

A family file holds one `ItemProcessor` per modality the family takes (today: images). Each
says which models it serves (`matches`), builds itself from the model's configs
(`from_files`), names the token its chat template writes once per item (`anchor_token_id`) and
the text vLLM puts there in a "string"-format prompt (`placeholder_text`), declares the
per-request options it accepts (`options`, a frozen dataclass) and turns decoded items into
tensors and each item's replacement token ids (`process`). Placeholder expansion, hashing and
the wire are shared (`multimodal.prompt`, `multimodal.pipeline`, `multimodal.wire`).
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

import numpy as np

from multimodal.errors import MmgateError
from multimodal.processors.options import NoOptions, OptionError, parse_options
from multimodal.prompt import Range

if TYPE_CHECKING:
    from multimodal.processors.items import ItemShare

Modality = Literal["image", "video", "audio"]

__all__ = [
    "ItemProcessor",
    "Modality",
    "ModelConfigError",
    "ModelConfigs",
    "OptionError",
    "ProcessedItems",
    "UnsupportedModel",
    "VideoProcessor",
    "VideoSampling",
    "matches_model",
]


class ModelConfigError(MmgateError):
    """The model's configs describe something this family cannot reproduce."""

    status = 500


class UnsupportedModel(MmgateError):
    """No family here serves this model (or this modality of it)."""


class ModelConfigs(Protocol):
    """What a family reads of a model (gateway.render.model_files.ModelFiles provides it)."""

    @property
    def config(self) -> Mapping[str, Any]: ...  # config.json

    @property
    def preprocessor(self) -> Mapping[str, Any]: ...  # the image processor's config

    @property
    def video_preprocessor(self) -> Mapping[str, Any]: ...  # the video processor's config

    @property
    def audio_preprocessor(self) -> Mapping[str, Any]: ...  # the feature extractor's config

    @property
    def vocab(self) -> Mapping[str, int]: ...  # token text -> id, added tokens included

    @property
    def tokenizer(self) -> Any: ...  # a tokenizers.Tokenizer, for replacements holding text

    @property
    def named_tokens(self) -> Mapping[str, str]: ...  # tokenizer attributes, e.g. image_token


def matches_model(
    files: ModelConfigs, model_types: Sequence[str], image_processors: Sequence[str]
) -> bool:
    """The model_type is one of `model_types`, and the image processor (if the config names
    one; released checkpoints name the Fast class) one of `image_processors`."""
    kind = files.preprocessor.get("image_processor_type")
    return files.config.get("model_type") in model_types and (
        kind is None or kind.removesuffix("Fast") in image_processors
    )


@dataclass
class ProcessedItems:
    """Model-ready tensors for a request's items of one modality, in the engine's layout."""

    tensors: dict[str, np.ndarray]  # wire name -> array; the encoder input under encoder_key
    batched_keys: tuple[str, ...] = ()
    flat_keys: dict[str, str] = field(default_factory=dict)  # tensor -> its per-item sizes tensor
    keep_on_cpu_keys: tuple[str, ...] = ()
    replacements: list[list[int]] = field(default_factory=list)  # per item: its anchor's ids
    embed_token_id: int | None = None  # set when replacements hold non-embedding tokens
    # The model's name for the encoder input (sent in the wire's `pixel_values` field, named by
    # its `encoder_input_key`): audio models take e.g. `input_features`.
    encoder_key: str = "pixel_values"


class ItemProcessor(ABC):
    family: ClassVar[str]  # e.g. "qwen_vl": in reports and in every item's hash
    title: ClassVar[str]  # e.g. "Qwen-VL": in messages to clients
    modality: ClassVar[Modality] = "image"
    # What vLLM's model class (get_placeholder_str) puts in a "string"-format chat prompt per
    # item; the tokens the chat template itself writes may differ. A function of the item's
    # number among its modality's (from 1) where vLLM numbers them (audio: "Audio N: ...").
    placeholder_text: ClassVar[str | Callable[[int], str]]
    # The mm_processor_kwargs a request may set, as a frozen dataclass (none by default).
    options: ClassVar[type] = NoOptions

    @classmethod
    @abstractmethod
    def matches(cls, files: ModelConfigs) -> bool: ...

    @classmethod
    @abstractmethod
    def from_files(cls, files: ModelConfigs) -> ItemProcessor: ...

    @property
    @abstractmethod
    def anchor_token_id(self) -> int:
        """The token the model's chat template emits once per item."""

    def resolve(self, kwargs: Mapping[str, Any]) -> Any:
        """The settings for one request: its mm_processor_kwargs, validated against `options`,
        over the model's defaults. The result (a frozen dataclass) is part of every item's
        hash, so it must hold everything that changes the tensors."""
        if not kwargs:  # the common case: no parsing
            return self.defaults
        return self.settings_for(parse_options(self.options, kwargs, self.title))

    @functools.cached_property
    def defaults(self) -> Any:
        """The settings of a request without mm_processor_kwargs. Families that keep their
        model's settings set this to them (an attribute or a class attribute hides this);
        for the others it is no options merged as `settings_for` merges any, worked out once."""
        return self.settings_for(parse_options(self.options, {}, self.title))

    def settings_for(self, options: Any) -> Any:
        """`options` merged over the model's defaults; families with options override it."""
        return options

    def finish_prompt(
        self, ids: list[int], ranges: list[list[Range]]
    ) -> tuple[list[int], list[list[Range]]]:
        """The expanded prompt as vLLM's processor leaves it, with every modality's ranges in
        it. Most families leave it as expanded; Gemma 3 fuses the newline tokens its
        replacements put next to the prompt's."""
        return ids, ranges

    def join(self, shares: Sequence[ItemShare]) -> ProcessedItems:
        """The batch `process` gives for the items whose shares (`multimodal.processors.items`)
        these are, in this order. Families whose layout depends on the batch override it."""
        # Imported here: items builds on this module (ProcessedItems).
        from multimodal.processors.items import join_items

        return join_items(shares)

    @abstractmethod
    def process(self, items: Sequence[Any], settings: Any, raw_pixels: bool) -> ProcessedItems:
        """Decoded items to tensors, with `settings` from `resolve`; `raw_pixels` keeps uint8
        for engines that normalize on device. Images are HxWx3 uint8 RGB arrays; videos are
        `multimodal.video_decode.DecodedClip`s (see `VideoProcessor`)."""


@dataclass(frozen=True)
class VideoSampling:
    """A request's `media_io_kwargs["video"]`: what vLLM's video loader takes per request
    (None: the loader's default). `fps`: the rate frames are sampled at (Qwen's, GLM's and the
    default loader's); `num_frames`: the most frames the default loader keeps, and the most
    frames of a `data:video/jpeg` list (32 by default); a frame list's rate is `fps` (1)."""

    fps: float | None = None
    num_frames: int | None = None


class VideoProcessor(ItemProcessor):
    """A family's videos. vLLM decodes only the frames its video loader picks for the model
    (chosen from the checkpoint's video processor class), so the family says which
    (`pick_frames`), the clip is decoded with those (`multimodal.video.load_video`), and
    `process` gets `DecodedClip`s: the kept frames (N, H, W, 3 uint8 RGB), their source
    indices, the corrected frame count and the container's rate, which timestamps and
    `second_per_grid_ts` come from."""

    modality: ClassVar[Modality] = "video"

    @abstractmethod
    def pick_frames(
        self, total_frames: int, fps: float, settings: Any, sampling: VideoSampling
    ) -> list[int]:
        """The source frames vLLM's loader keeps of a clip of `total_frames` frames (after the
        decoder's seek-to-the-end correction) at `fps` (the container's; 0 when unknown),
        under the request's `sampling`. Raises OptionError or ValueError for a clip the loader
        cannot sample (vLLM fails there)."""
