"""Gemma 4 images: variable resolution under a soft-token budget, as flat padded patches.

Mirrors transformers' Gemma4ImageProcessor (torchvision backend, which vLLM runs): each image
is resized, keeping its aspect ratio, to the largest size whose sides are multiples of
patch x pooling (16 x 3 = 48 px) and whose patches fit `max_soft_tokens` x pooling^2 (the
budget: 280 soft tokens, 2520 patches in the released checkpoints), bicubic; it is then
rescaled to [0, 1] (no normalization: the vision tower computes 2 * (x - 0.5) itself) and cut
into 16 x 16 patches, each a row of 768 values in (y, x, channel) order, the image's rows of
patches one after another. Every image is padded with zero patches up to the budget's patch
count, and `pixel_position_ids` gives each patch its (x, y) on the patch grid, (-1, -1) for
the padding. The encoder pools each 3 x 3 block of patches into one soft token, so an image
of H x W resized pixels yields (H / 48) * (W / 48) embeddings.

The chat template writes `<|image|>` once per image; vLLM (Gemma4ProcessingInfo.
get_image_repl) replaces it with `<|image>` (config's boi_token_id) + n x `<|image|>` +
`<image|>` (eoi_token_id), of which only the `<|image|>` tokens are embeddings, and nothing
around it (no newlines to fuse, unlike Gemma 3). Where this follows vLLM over transformers:
- the tensor names and layout: vLLM's Gemma4MultiModalProcessor renames transformers'
  `image_position_ids` to `pixel_position_ids` and batches both per image;
- the soft-token count n: vLLM computes it itself from the image size and the vision config
  (`_compute_num_soft_tokens`, a formula of its own, clamped to the budget); here it comes
  from the resized size, which agrees with vLLM's on every size tested (test_gemma4.py
  compares the two on ~5,000 sizes, extreme aspect ratios and exact fits included, at every
  budget);
- the default budget: vLLM counts with `vision_config.default_output_length` while the
  pixels follow the image processor's `max_soft_tokens`; a model whose two values differ
  would make vLLM's prompt disagree with its own encoder, so it is refused here;
- per-request options: `max_soft_tokens` (top level or in `images_kwargs`, as vLLM reads
  it), one of 70, 140, 280, 560, 1120. Of transformers' other image keys, patch_size and
  pooling_kernel_size are refused because vLLM counts tokens with the model's own values (a
  request changing them would desynchronize its prompt from its pixels); the pixel keys
  (do_rescale, image_mean, ...) are not offered, as for the other families here;
- the "string"-format placeholder vLLM writes (get_placeholder_str) is "<image_soft_token>",
  not a token of Gemma 4's vocabulary: a model whose chat template renders content as a
  string gets no `<|image|>` anchor from it, there as here (a 400 here).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from multimodal.processors.base import (
    ItemProcessor,
    ModelConfigError,
    ModelConfigs,
    OptionError,
    ProcessedItems,
    matches_model,
)
from multimodal.processors.options import option
from multimodal.processors.transforms import (
    RESAMPLE,
    channel_triple,
    fused_normalization,
    resize_to,
)

MODEL_TYPES = ("gemma4",)
IMAGE_PROCESSORS = ("Gemma4ImageProcessor",)
IMAGE_TOKEN = "<|image|>"  # the tokenizer's image_token: the template's anchor, the embeddings
SUPPORTED_SOFT_TOKENS = (70, 140, 280, 560, 1120)  # transformers' and vLLM's allowed budgets
POSITIONS_KEY = "pixel_position_ids"  # vLLM's name for transformers' image_position_ids
# Gemma4ImageProcessor's class defaults, under whatever the processor config sets.
PIXEL_DEFAULTS: dict[str, Any] = {
    "do_resize": True,
    "resample": 3,
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": False,
    "image_mean": [0.0, 0.0, 0.0],
    "image_std": [1.0, 1.0, 1.0],
    "patch_size": 16,
    "max_soft_tokens": 280,
    "pooling_kernel_size": 3,
}


@dataclass(frozen=True)
class Gemma4ImagesKwargs:
    """The `images_kwargs` object of mm_processor_kwargs, as vLLM reads it for Gemma 4."""

    max_soft_tokens: int | None = option(minimum=1, doc="soft tokens per image at most")


@dataclass(frozen=True)
class Gemma4Options:
    """mm_processor_kwargs for Gemma 4 images: the soft-token budget per image."""

    max_soft_tokens: int | None = option(
        minimum=1, doc="soft tokens per image at most: 70, 140, 280, 560 or 1120"
    )
    images_kwargs: Gemma4ImagesKwargs | None = option(doc="max_soft_tokens, nested")


@dataclass(frozen=True)
class Gemma4Settings:
    """One request's settings: the soft-token budget of each of its images."""

    max_soft_tokens: int


@dataclass(frozen=True)
class Gemma4Pixels:
    """The image processor's settings (processor config over the class defaults)."""

    patch: int
    pooling: int
    method: str
    do_rescale: bool
    rescale_factor: float
    do_normalize: bool
    mean: tuple[float, float, float]
    std: tuple[float, float, float]


def target_size(height: int, width: int, patch: int, pooling: int, budget: int) -> tuple[int, int]:
    """transformers' get_aspect_ratio_preserving_size for a budget of `budget` soft tokens:
    the largest (height, width), both multiples of patch x pooling, of at most budget x
    pooling^2 patches, near the image's aspect ratio (a side that would round to 0 becomes one
    unit, the other then as long as the ratio says, within the budget)."""
    max_patches = budget * pooling**2
    factor = math.sqrt(max_patches * patch**2 / (height * width))
    unit = pooling * patch
    target_h = int(math.floor(factor * height / unit)) * unit
    target_w = int(math.floor(factor * width / unit)) * unit
    longest = (max_patches // pooling**2) * unit
    if target_h == 0:  # (both cannot be 0: the budget's area is at least 70 units squared)
        target_h, target_w = unit, min(int(math.floor(width / height)) * unit, longest)
    elif target_w == 0:
        target_h, target_w = min(int(math.floor(height / width)) * unit, longest), unit
    return target_h, target_w


class Gemma4Processor(ItemProcessor):
    family = "gemma4"
    title = "Gemma 4"
    options = Gemma4Options
    placeholder_text = "<image_soft_token>"  # Gemma4ForConditionalGeneration.get_placeholder_str
    hf_names = {POSITIONS_KEY: "image_position_ids"}  # transformers' names (mmgate preprocess)

    def __init__(
        self, pixels: Gemma4Pixels, image: int, boi: int, eoi: int, default_budget: int
    ) -> None:
        self.pixels = pixels
        self.image_token, self.boi, self.eoi = image, boi, eoi
        self.defaults = Gemma4Settings(default_budget)
        if pixels.do_normalize:  # transformers fuses rescale into normalize: (x - m/r) / (s/r)
            scale = pixels.rescale_factor if pixels.do_rescale else 1.0
            self._mean, self._std = fused_normalization(pixels.mean, pixels.std, scale)
        self._replacement = functools.lru_cache(maxsize=64)(self._new_replacement)

    @classmethod
    def matches(cls, files: ModelConfigs) -> bool:
        return matches_model(files, MODEL_TYPES, IMAGE_PROCESSORS)

    @classmethod
    def from_files(cls, files: ModelConfigs) -> Gemma4Processor:
        given = {k: v for k, v in files.preprocessor.items() if v is not None}
        pre = {**PIXEL_DEFAULTS, **given}
        vision = files.config.get("vision_config") or {}
        patch, pooling = int(pre["patch_size"]), int(pre["pooling_kernel_size"])
        # vLLM counts soft tokens with the vision config's values, the pixels follow these.
        if (patch, pooling) != (vision.get("patch_size", 16), vision.get("pooling_kernel_size", 3)):
            raise ModelConfigError(
                f"Gemma 4 image processor patch/pooling {patch}/{pooling} differ from the vision "
                f"tower's {vision.get('patch_size')}/{vision.get('pooling_kernel_size')}"
            )
        budget = int(pre["max_soft_tokens"])
        counted = int(vision.get("default_output_length", budget))
        if budget != counted or budget not in SUPPORTED_SOFT_TOKENS:
            raise ModelConfigError(
                f"Gemma 4 image processor max_soft_tokens {budget} must be one of "
                f"{SUPPORTED_SOFT_TOKENS} and equal vision_config.default_output_length "
                f"({counted}), with which vLLM counts an image's tokens"
            )
        if not pre["do_resize"]:
            raise ModelConfigError("Gemma 4 without do_resize is not supported")
        resample = int(pre["resample"])
        if resample not in RESAMPLE:
            raise ModelConfigError(f"resample mode {resample} is not supported")
        pixels = Gemma4Pixels(
            patch=patch,
            pooling=pooling,
            method=RESAMPLE[resample],
            do_rescale=bool(pre["do_rescale"]),
            rescale_factor=float(pre["rescale_factor"]),
            do_normalize=bool(pre["do_normalize"]),
            mean=channel_triple(pre["image_mean"]),
            std=channel_triple(pre["image_std"]),
        )
        image = files.vocab.get(IMAGE_TOKEN)
        boi, eoi = files.config.get("boi_token_id"), files.config.get("eoi_token_id")
        if image is None or boi is None or eoi is None:
            raise ModelConfigError(
                f"Gemma 4 needs {IMAGE_TOKEN!r} in the vocabulary and boi_token_id / "
                "eoi_token_id in config.json"
            )
        return cls(pixels, image, int(boi), int(eoi), budget)

    @property
    def anchor_token_id(self) -> int:
        return self.image_token

    def settings_for(self, options: Gemma4Options) -> Gemma4Settings:
        top = options.max_soft_tokens
        nested = options.images_kwargs.max_soft_tokens if options.images_kwargs else None
        if top is not None and nested is not None and top != nested:
            raise OptionError(
                "mm_processor_kwargs.max_soft_tokens and images_kwargs.max_soft_tokens differ"
            )
        budget = top if top is not None else nested
        if budget is None:
            return self.defaults
        if budget not in SUPPORTED_SOFT_TOKENS:
            where = "max_soft_tokens" if top is not None else "images_kwargs.max_soft_tokens"
            allowed = ", ".join(map(str, SUPPORTED_SOFT_TOKENS))
            raise OptionError(f"mm_processor_kwargs.{where} must be one of {allowed}")
        return Gemma4Settings(budget)

    def target_size(self, height: int, width: int, settings: Gemma4Settings) -> tuple[int, int]:
        p = self.pixels
        return target_size(height, width, p.patch, p.pooling, settings.max_soft_tokens)

    def num_soft_tokens(self, height: int, width: int, settings: Gemma4Settings) -> int:
        """The embeddings an image of this size becomes (vLLM's get_image_repl count)."""
        target_h, target_w = self.target_size(height, width, settings)
        unit = self.pixels.patch * self.pixels.pooling
        return (target_h // unit) * (target_w // unit)

    def replacement(self, num_soft_tokens: int) -> list[int]:
        """vLLM's get_image_repl ids for an image of this many soft tokens."""
        return list(self._replacement(num_soft_tokens))

    def _new_replacement(self, count: int) -> tuple[int, ...]:
        return (self.boi, *([self.image_token] * count), self.eoi)

    def process(
        self, images: Sequence[np.ndarray], settings: Gemma4Settings, raw_pixels: bool
    ) -> ProcessedItems:
        p = self.pixels
        max_patches = settings.max_soft_tokens * p.pooling**2
        raw = raw_pixels or not (p.do_rescale or p.do_normalize)
        # Each image's patches, then zeros to the budget: every byte written once (np.zeros
        # would zero the whole 7.7 MB of a 280-token float image before the patches overwrite it).
        dtype = np.uint8 if raw else np.float32
        pixels = np.empty((len(images), max_patches, 3 * p.patch**2), dtype)
        positions = np.full((len(images), max_patches, 2), -1, np.int64)
        counts = []
        for image, out, where in zip(images, pixels, positions):
            height, width = self.target_size(image.shape[0], image.shape[1], settings)
            resized = resize_to(image, height, width, p.method)
            rows, cols = height // p.patch, width // p.patch
            # (rows, patch, cols, patch, 3) -> (rows, cols, patch, patch, 3): one patch per row.
            patches = resized.reshape(rows, p.patch, cols, p.patch, 3).swapaxes(1, 2)
            self._write(patches, out[: rows * cols].reshape(patches.shape), raw)
            out[rows * cols :] = 0
            grid = where[: rows * cols].reshape(rows, cols, 2)
            grid[..., 0] = np.arange(cols)  # x
            grid[..., 1] = np.arange(rows)[:, None]  # y
            counts.append(rows * cols // p.pooling**2)
        return ProcessedItems(
            tensors={"pixel_values": pixels, POSITIONS_KEY: positions},
            batched_keys=("pixel_values", POSITIONS_KEY),
            replacements=[self.replacement(n) for n in counts],
            embed_token_id=self.image_token,
        )

    def _write(self, patches: np.ndarray, out: np.ndarray, raw: bool) -> None:
        """uint8 patches into `out` as they are when `raw`, else rescaled (normalized) float32,
        as transformers' rescale_and_normalize: x * r, or (x - mean/r) / (std/r) fused."""
        p = self.pixels
        if raw:
            out[...] = patches
        elif p.do_normalize:
            np.subtract(patches, self._mean, out=out, dtype=np.float32)
            np.divide(out, self._std, out=out)
        else:
            np.multiply(patches, np.float32(p.rescale_factor), out=out, dtype=np.float32)
