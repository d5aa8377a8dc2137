"""Mistral 3 (`mistral3`, e.g. Mistral Small 3.1) and HF-format Pixtral (`llava` with a
`pixtral` vision tower) images: variable resolution, one token per (merged) patch, row breaks.

Mirrors transformers' PixtralProcessor over PixtralImageProcessor (torchvision backend, which
vLLM runs): each image is scaled down, keeping its aspect ratio, until its longest edge fits
`size.longest_edge` (floor, never up), each side then rounded up to a whole number of tokens
(patch_size x spatial_merge_size pixels: 28 for Mistral 3, 16 for Pixtral-12B) and resized
there, bicubic; then the fused rescale+normalize in float32. Its `[IMG]` anchor becomes one row
of `[IMG]` per row of tokens, each row closed by `[IMG_BREAK]` and the last by `[IMG_END]`, as
vLLM's prompt replacement writes it (`Mistral3MultiModalProcessor`, and llava.py's
`PixtralHFMultiModalProcessor`); only the `[IMG]` positions take embeddings, so
`embed_token_id` is `[IMG]`. vLLM counts the grid from the image size with the same
arithmetic (`PixtralHFEncoderInfo.get_patch_grid_size`); for Mistral 3 from the processor's
`longest_edge` (a request may override it with `size`), for Pixtral-HF from the vision tower's
`image_size` (so no option changes it).

Where vLLM and transformers differ, this follows vLLM:
- Layout. transformers zero-pads the images of a request to one [N, 3, H, W] batch with their
  `image_sizes`; vLLM cuts each back to its own [3, h, w] (`_postprocess_hf_mm_data`), so an
  image's encoding never depends on the others. On the wire, a batch whose images share one
  size is just that (`pixel_values` batched, nothing padded); a ragged batch is sent padded,
  with `pixel_values` pointing at `image_sizes` in `flat_keys`: a sizes tensor with a column
  per trailing dimension gives each item's extent, and the engine cuts every item to it.
  `image_sizes` (resized height, width) is always sent, batched and kept on the CPU.
- Counts come from the model config (vision patch size, config.spatial_merge_size,
  config.image_token_index), as vLLM reads them, not from processor_config.json.
- Placeholder text: Mistral 3's `get_placeholder_str` returns None (its chat template writes
  `[IMG]` itself), so "" here; Pixtral-HF is served by vLLM's LLaVA class, whose is "<image>".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from multimodal.errors import MediaError
from multimodal.processors.base import (
    ItemProcessor,
    ModelConfigError,
    ModelConfigs,
    ProcessedItems,
)
from multimodal.processors.items import ItemShare
from multimodal.processors.options import NoOptions, option
from multimodal.processors.pixels import PixelPipeline, PixelSettings
from multimodal.processors.transforms import (
    CLIP_MEAN,
    CLIP_STD,
    RESAMPLE,
    channel_triple,
    resize_to,
)

IMAGE_PROCESSORS = ("PixtralImageProcessor",)
VISION_TOWER = "pixtral"
IMAGE_TOKEN = "[IMG]"
BREAK_TOKEN = "[IMG_BREAK]"
END_TOKEN = "[IMG_END]"
SIZES_KEY = "image_sizes"
# PixtralImageProcessor's and the configs' defaults, for files that leave a field out.
DEFAULT_LONGEST_EDGE = 1024
DEFAULT_PATCH_SIZE = 16
DEFAULT_IMAGE_TOKEN_INDEX = 10
MISTRAL3_MERGE = 2  # Mistral3Config.spatial_merge_size


@dataclass(frozen=True)
class PixtralSize:
    """The `size` object of PixtralImageProcessor, as vLLM's Mistral 3 merges it over the
    model's: only `longest_edge` is read there."""

    longest_edge: int | None = option(minimum=1, doc="longest side after the resize")


@dataclass(frozen=True)
class Mistral3Options:
    """mm_processor_kwargs for Mistral 3 images: vLLM counts the tokens with the request's
    `size.longest_edge`, so it may change per request."""

    size: PixtralSize | None = None


@dataclass(frozen=True)
class PixtralResize:
    """What one request's images are fitted into: its options over the model's."""

    longest_edge: int


@dataclass(frozen=True)
class PixtralSettings:
    """The model's: what every request shares."""

    longest_edge: int  # the image processor's size.longest_edge
    token_pixels: int  # the side of one token's square: patch_size x spatial_merge_size
    image_token_id: int
    break_token_id: int
    end_token_id: int


def resized_size(height: int, width: int, longest_edge: int, token_pixels: int) -> tuple[int, int]:
    """transformers' pixtral get_resize_output_image_size, to the operation: scale down
    (floor) to fit longest_edge, then round each side up to whole tokens. vLLM's
    get_patch_grid_size counts rows and columns with the same arithmetic."""
    ratio = max(height / longest_edge, width / longest_edge)
    if ratio > 1:
        height = math.floor(height / ratio)
        width = math.floor(width / ratio)
    rows = (height - 1) // token_pixels + 1
    cols = (width - 1) // token_pixels + 1
    return rows * token_pixels, cols * token_pixels


def image_tokens(rows: int, cols: int, image: int, row_break: int, end: int) -> list[int]:
    """vLLM's replacement: a row of `image` per token row, each closed by `row_break`, the
    last one by `end`."""
    tokens = ([image] * cols + [row_break]) * rows
    tokens[-1] = end
    return tokens


def is_pixtral_tower(config: Mapping[str, Any]) -> bool:
    return (config.get("vision_config") or {}).get("model_type") == VISION_TOWER


def pixtral_image_processor(pre: Mapping[str, Any]) -> bool:
    kind = pre.get("image_processor_type")
    return kind is None or kind.removesuffix("Fast") in IMAGE_PROCESSORS


class Mistral3Processor(ItemProcessor):
    family = "pixtral"
    title = "Mistral 3"
    placeholder_text = ""  # Mistral3ForConditionalGeneration.get_placeholder_str: None
    options = Mistral3Options

    def __init__(self, settings: PixtralSettings, pixels: PixelSettings) -> None:
        self.settings = settings
        self.pixels = PixelPipeline(pixels)
        self.defaults = PixtralResize(settings.longest_edge)

    @classmethod
    def matches(cls, files: ModelConfigs) -> bool:
        # Mistral3Config's only tower is Pixtral's (its default when config.json has none).
        return files.config.get("model_type") == "mistral3" and pixtral_image_processor(
            files.preprocessor
        )

    @classmethod
    def from_files(cls, files: ModelConfigs) -> ItemProcessor:
        merge = int(files.config.get("spatial_merge_size", MISTRAL3_MERGE))
        return cls(_settings(files, merge, _longest_edge(files.preprocessor)), _pixels(files))

    @property
    def anchor_token_id(self) -> int:
        return self.settings.image_token_id

    def settings_for(self, options: Any) -> PixtralResize:
        size = getattr(options, "size", None)
        if size is None or size.longest_edge is None:
            return self.defaults
        return PixtralResize(size.longest_edge)

    def grid(self, height: int, width: int, resize: PixtralResize) -> tuple[int, int]:
        """Token rows and columns of an image of this size."""
        side = self.settings.token_pixels
        h, w = resized_size(height, width, resize.longest_edge, side)
        return h // side, w // side

    def process(
        self, images: Sequence[np.ndarray], settings: PixtralResize, raw_pixels: bool
    ) -> ProcessedItems:
        sizes = [self._resized(index, image, settings) for index, image in enumerate(images)]
        ragged = len(set(sizes)) > 1
        height, width = max(h for h, _ in sizes), max(w for _, w in sizes)
        # Only a ragged batch has padding to fill (zeros, as transformers pads).
        alloc = np.zeros if ragged else np.empty
        dtype = self.pixels.out_dtype(raw_pixels)
        pixel_values = alloc((len(images), 3, height, width), dtype)
        for image, (h, w), out in zip(images, sizes, pixel_values):
            resized = resize_to(image, h, w, self.pixels.settings.method)
            self._finish_into(resized, raw_pixels, out[:, :h, :w])
        side = self.settings.token_pixels
        return ProcessedItems(
            tensors={
                "pixel_values": pixel_values,
                SIZES_KEY: np.asarray(sizes, dtype=np.int64).reshape(len(images), 2),
            },
            batched_keys=(SIZES_KEY,) if ragged else ("pixel_values", SIZES_KEY),
            flat_keys={"pixel_values": SIZES_KEY} if ragged else {},
            keep_on_cpu_keys=(SIZES_KEY,),
            replacements=[image_tokens(h // side, w // side, *self._tokens) for h, w in sizes],
            embed_token_id=self.settings.image_token_id,
        )

    def join(self, shares: Sequence[ItemShare]) -> ProcessedItems:
        # The layout depends on the batch: padded and cut by extents only when ragged.
        joined = super().join(shares)
        ragged = len({tuple(s.tensors[SIZES_KEY].tolist()) for s in shares}) > 1
        joined.batched_keys = (SIZES_KEY,) if ragged else ("pixel_values", SIZES_KEY)
        joined.flat_keys = {"pixel_values": SIZES_KEY} if ragged else {}
        return joined

    @property
    def _tokens(self) -> tuple[int, int, int]:
        s = self.settings
        return s.image_token_id, s.break_token_id, s.end_token_id

    def _resized(self, index: int, image: np.ndarray, resize: PixtralResize) -> tuple[int, int]:
        h, w = resized_size(
            image.shape[0], image.shape[1], resize.longest_edge, self.settings.token_pixels
        )
        if h < 1 or w < 1:  # transformers and vLLM both fail on it; say why
            raise MediaError(
                f"a {image.shape[1]}x{image.shape[0]} image is too thin: fitted into "
                f"{resize.longest_edge} pixels its short side has no pixel left",
                index=index,
            )
        return h, w

    def _finish_into(self, image: np.ndarray, raw_pixels: bool, out: np.ndarray) -> None:
        if out.flags.c_contiguous:
            self.pixels.finish(image, raw_pixels, out)
        else:  # a smaller image's corner of a padded batch
            out[...] = self.pixels.finish(image, raw_pixels)


class PixtralHFProcessor(Mistral3Processor):
    """Pixtral-12B in HF format: vLLM serves it with its LLaVA model class, counting tokens
    from the vision tower's image_size whatever the request asks, so no option is taken."""

    title = "Pixtral"
    placeholder_text = "<image>"  # LlavaForConditionalGeneration.get_placeholder_str
    options = NoOptions

    @classmethod
    def matches(cls, files: ModelConfigs) -> bool:
        # model_type "llava" is LLaVA-1.5's too: the tower and the image processor tell.
        kind = files.preprocessor.get("image_processor_type")
        return (
            files.config.get("model_type") == "llava"
            and is_pixtral_tower(files.config)
            and kind is not None
            and pixtral_image_processor(files.preprocessor)
        )

    @classmethod
    def from_files(cls, files: ModelConfigs) -> ItemProcessor:
        longest = _longest_edge(files.preprocessor)
        tower = int(files.config["vision_config"].get("image_size", DEFAULT_LONGEST_EDGE))
        if tower != longest:
            # vLLM would count tokens for one size while transformers resizes to the other.
            raise ModelConfigError(
                f"vision_config.image_size {tower} differs from the image processor's "
                f"longest_edge {longest}: vLLM's token count would not match the pixels"
            )
        return cls(_settings(files, 1, longest), _pixels(files))


def _longest_edge(pre: Mapping[str, Any]) -> int:
    size = pre.get("size") or {"longest_edge": DEFAULT_LONGEST_EDGE}
    if not size.get("longest_edge"):
        raise ModelConfigError(f"the image processor's size {size} has no longest_edge")
    return int(size["longest_edge"])


def _settings(files: ModelConfigs, merge: int, longest_edge: int) -> PixtralSettings:
    config, vocab = files.config, files.vocab
    patch = int((config.get("vision_config") or {}).get("patch_size", DEFAULT_PATCH_SIZE))
    token = config.get("image_token_index", config.get("image_token_id"))
    try:
        row_break, end = vocab[BREAK_TOKEN], vocab[END_TOKEN]
    except KeyError as missing:
        raise ModelConfigError(f"the tokenizer has no {missing} token") from None
    return PixtralSettings(
        longest_edge=longest_edge,
        token_pixels=patch * merge,
        image_token_id=int(DEFAULT_IMAGE_TOKEN_INDEX if token is None else token),
        break_token_id=int(row_break),
        end_token_id=int(end),
    )


def _pixels(files: ModelConfigs) -> PixelSettings:
    """The image processor's rescale/normalize (its resize and pad are done here)."""
    pre = files.preprocessor
    if not pre.get("do_resize", True) or pre.get("do_center_crop"):
        # Token counts are vLLM's for the resized image; anything else breaks them.
        raise ModelConfigError("Pixtral images must be resized (do_resize) and not cropped")
    if int(pre.get("resample", 3)) != 3:
        raise ModelConfigError(f"resample mode {pre['resample']} is not supported (bicubic)")
    return PixelSettings(
        shortest_edge=None,
        resize_hw=None,
        do_resize=False,
        crop_hw=None,
        pad_to_square=False,
        method=RESAMPLE[3],
        do_rescale=bool(pre.get("do_rescale", True)),
        rescale_factor=float(pre.get("rescale_factor", 1 / 255)),
        do_normalize=bool(pre.get("do_normalize", True)),
        mean=channel_triple(pre.get("image_mean", CLIP_MEAN)),
        std=channel_triple(pre.get("image_std", CLIP_STD)),
    )
