"""Idefics3 and SmolVLM images: the long edge resized, cut into square tiles, plus a global tile.

Mirrors transformers' Idefics3ImageProcessor (SmolVLMImageProcessor is the same code; torchvision
backend, which vLLM runs) as vLLM's Idefics3ForConditionalGeneration and
SmolVLMForConditionalGeneration feed it (vllm/model_executor/models/idefics3.py, smolvlm.py):

- the image resized so its long edge is `size.longest_edge` (up or down, the short edge int()
  and made even), then so both edges are multiples of the tile side `max_image_size` (T);
- with splitting on and an image larger than one tile: rows x cols tiles of T x T, row by row,
  then the whole (multiple-of-T) image resized to T x T (the global tile); otherwise one tile,
  the image resized to T x T;
- rescale and normalize fused in float32 (mean = std = 0.5 in the released checkpoints).

Where vLLM and transformers differ, vLLM wins:

- the replacement is vLLM's `get_image_repl` tokenized on its own (per tile
  `<fake_token_around_image><row_r_col_c>` and image_seq_len `<image>`, a newline after each
  row, then a newline, `<fake_token_around_image><global-img>`, the global tile's `<image>` run
  and a closing `<fake_token_around_image>`), and only the `<image>` positions take embeddings;
  the rows and columns are vLLM's count (`get_number_of_image_patches`), which must equal the
  tiles transformers cuts: an image for which they would differ is refused;
- `<image>` per tile comes from the model config ((image_size / patch_size)^2 over
  scale_factor^2), which is what the model produces; the processor config's image_seq_len
  must agree with it for vLLM to run at all;
- `pixel_values` (tiles, 3, T, T) and `pixel_attention_mask` (tiles, T, T), both flat with
  the per-image `num_patches` sizes tensor (batched, kept on CPU), as vLLM's
  `_get_mm_fields_config`; the mask is all ones (every tile is T x T) and int64, as
  transformers returns it.

Raw pixels: vLLM 0.32 does not normalize Idefics3 pixels on device; with `raw_pixels` the tiles
are uint8 holding the values transformers gives with do_rescale and do_normalize off (it hands
them over as float32 after its padding step).

Resampling: the released checkpoints (Idefics3's and SmolVLM's) ask for LANCZOS, which
torchvision 0.28 runs on uint8 tensors on CPU (torch's `_upsample_lanczos2d_aa`) and
`multimodal.resize` reproduces bit for bit; BICUBIC and BILINEAR configs are served too. A
model asking for another filter (NEAREST, BOX, HAMMING) is declined by `matches`, so the
engine workers preprocess its images rather than the gateway giving other pixels.

SmolVLM (SmolVLM2 checkpoints, model_type `smolvlm`): the same image processor and
replacement; its processor takes the three token strings from tokenizer attributes
(`image_token`, `fake_image_token`, `global_image_token`, the tokenizer config's
extra_special_tokens) with Idefics3's strings as defaults, and so does this file (from the
model's `named_tokens`, which gateway.render.model_files reads that way).

Options (mm_processor_kwargs, as vLLM merges them into both the processor call and its
count): `do_image_splitting`; `size.longest_edge`, which must be a multiple of the tile side
(else vLLM's count and transformers' tiles disagree for some images); `max_image_size.
longest_edge`, only equal to the vision tower's image_size (vLLM's model refuses other tiles).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from multimodal import native
from multimodal.processors.base import (
    ItemProcessor,
    ModelConfigError,
    ModelConfigs,
    ProcessedItems,
    matches_model,
)
from multimodal.processors.options import OptionError, option
from multimodal.processors.pixels import PixelPipeline, PixelSettings
from multimodal.processors.transforms import channel_triple, resize_to, tiles_into
from multimodal.resize_weights import METHODS

IMAGE_PROCESSORS = ("Idefics3ImageProcessor", "SmolVLMImageProcessor")
SIZES_KEY = "num_patches"
MASK_KEY = "pixel_attention_mask"
# The processors' token strings (SmolVLM reads them from tokenizer attributes that default
# to the same text; its processor calls the global tag `global_image_token`).
IMAGE = "<image>"
FAKE = "<fake_token_around_image>"
GLOBAL = "<global-img>"
# transformers' Idefics3ImageProcessor: absolute cap on an edge after the first resize.
MAX_IMAGE_SIZE = 4096
# PIL resample codes: 1 LANCZOS (the released checkpoints), 2 BILINEAR, 3 BICUBIC.
RESAMPLE = {1: "lanczos", 2: "bilinear", 3: "bicubic"}
DEFAULTS = {"longest_edge": 4 * 364, "tile": 364, "resample": 1}


@dataclass(frozen=True)
class LongestEdge:
    longest_edge: int | None = option(minimum=1, doc="the long edge in pixels")


@dataclass(frozen=True)
class Idefics3Options:
    """mm_processor_kwargs for Idefics3 and SmolVLM images."""

    do_image_splitting: bool | None = option(doc="cut large images into tiles")
    size: LongestEdge | None = option(doc="the long edge before tiling")
    max_image_size: LongestEdge | None = option(doc="the tile side (the model's only)")


@dataclass(frozen=True)
class Idefics3Tiling:
    """Everything that changes one request's tensors: its options over the model's."""

    do_image_splitting: bool
    longest_edge: int
    tile: int


@dataclass(frozen=True)
class Grid:
    """Where an image goes: resized to (height, width), cut into rows x cols tiles (0 x 0:
    one tile, the image resized to the tile side)."""

    height: int
    width: int
    rows: int
    cols: int

    @property
    def tiles(self) -> int:
        return self.rows * self.cols + 1 if self.rows or self.cols else 1


def longest_edge_size(height: int, width: int, longest: int) -> tuple[int, int]:
    """transformers' get_resize_output_image_size: the long edge to `longest` (up or down),
    the other int() and made even, then both capped at MAX_IMAGE_SIZE."""
    ratio = width / height
    if width >= height:
        width, height = longest, int(longest / ratio)
        height += height % 2
    else:
        height, width = longest, int(longest * ratio)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    ratio = width / height
    if width >= height and width > MAX_IMAGE_SIZE:
        width, height = MAX_IMAGE_SIZE, int(MAX_IMAGE_SIZE / ratio)
    elif height > width and height > MAX_IMAGE_SIZE:
        height, width = MAX_IMAGE_SIZE, int(MAX_IMAGE_SIZE * ratio)
    return max(height, 1), max(width, 1)


def tile_multiple_size(height: int, width: int, tile: int) -> tuple[int, int]:
    """transformers' resize_for_vision_encoder: the long edge up to a multiple of the tile,
    the other edge from the aspect ratio (int()), then up to a multiple too."""
    ratio = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / ratio) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * ratio) / tile) * tile
    return height, width


def pixel_grid(height: int, width: int, tiling: Idefics3Tiling) -> Grid:
    """The tiles transformers' processor cuts from an image of this size."""
    h1, w1 = longest_edge_size(height, width, tiling.longest_edge)
    if not tiling.do_image_splitting:
        return Grid(h1, w1, 0, 0)
    h2, w2 = tile_multiple_size(h1, w1, tiling.tile)
    if h2 > tiling.tile or w2 > tiling.tile:
        return Grid(h2, w2, h2 // tiling.tile, w2 // tiling.tile)
    return Grid(h2, w2, 0, 0)


def vllm_rows_cols(height: int, width: int, tiling: Idefics3Tiling) -> tuple[int, int]:
    """transformers' get_number_of_image_patches, which vLLM counts the placeholder with: the
    short edge rounded up from the first resize's, not from the aspect ratio."""
    if not tiling.do_image_splitting:
        return 0, 0
    h1, w1 = longest_edge_size(height, width, tiling.longest_edge)
    rows, cols = math.ceil(h1 / tiling.tile), math.ceil(w1 / tiling.tile)
    return (rows, cols) if rows > 1 or cols > 1 else (0, 0)


@dataclass(frozen=True)
class ImageTokens:
    """The token strings of the replacement (vLLM's `_get_image_token`)."""

    image: str = IMAGE
    fake: str = FAKE
    global_tag: str = GLOBAL


def replacement_text(
    rows: int, cols: int, seq_len: int, tokens: ImageTokens = ImageTokens()
) -> str:
    """vLLM's Idefics3ProcessingInfo.get_image_repl."""
    run = tokens.image * seq_len
    fake = tokens.fake
    global_tile = fake + tokens.global_tag + run
    if rows == 0 and cols == 0:
        return global_tile + fake
    grid = "".join(
        "".join(f"{fake}<row_{r + 1}_col_{c + 1}>{run}" for c in range(cols)) + "\n"
        for r in range(rows)
    )
    return grid + "\n" + global_tile + fake


@dataclass(frozen=True)
class Idefics3Settings:
    """The model's image settings (preprocessor config, vision config)."""

    tiling: Idefics3Tiling
    vision_image_size: int  # the tile side the vision tower takes
    seq_len: int  # <image> tokens per tile
    pixels: PixelSettings
    tokens: ImageTokens = ImageTokens()


def resample_method(pre: Any) -> str | None:
    """The resize method named by the config, None if `multimodal.resize` lacks it."""
    method = RESAMPLE.get(int(pre.get("resample", DEFAULTS["resample"])))
    return method if method in METHODS else None


def settings_from(files: ModelConfigs, tokens: ImageTokens = ImageTokens()) -> Idefics3Settings:
    pre, config = files.preprocessor, files.config
    vision = config.get("vision_config") or {}
    image_size, patch_size = int(vision.get("image_size", 224)), int(vision.get("patch_size", 32))
    scale = int(config.get("scale_factor", 2))
    tile = int((pre.get("max_image_size") or {}).get("longest_edge", DEFAULTS["tile"]))
    if tile != image_size:
        raise ModelConfigError(f"tile side {tile} differs from the vision image_size {image_size}")
    method = resample_method(pre)
    if method is None:
        raise ModelConfigError(f"resample mode {pre.get('resample')} is not supported")
    for flag in ("do_resize", "do_pad"):
        # vLLM counts as if resized; its model needs the attention mask padding returns.
        if not pre.get(flag, True):
            raise ModelConfigError(f"Idefics3 with {flag} false is not supported")
    pixels = PixelSettings(
        shortest_edge=None,
        resize_hw=(tile, tile),
        do_resize=True,
        crop_hw=None,
        pad_to_square=False,
        method=method,
        do_rescale=bool(pre.get("do_rescale", True)),
        rescale_factor=float(pre.get("rescale_factor", 1 / 255)),
        do_normalize=bool(pre.get("do_normalize", True)),
        mean=channel_triple(pre.get("image_mean", 0.5)),
        std=channel_triple(pre.get("image_std", 0.5)),
    )
    size = pre.get("size") or {}
    tiling = Idefics3Tiling(
        do_image_splitting=bool(pre.get("do_image_splitting", True)),
        longest_edge=int(size.get("longest_edge", DEFAULTS["longest_edge"])),
        tile=tile,
    )
    if tiling.longest_edge % tile:
        # vLLM's count and transformers' tiles would disagree for some images.
        raise ModelConfigError(
            f"size.longest_edge {tiling.longest_edge} is not a multiple of {tile}"
        )
    # Idefics3Model.image_seq_len: what the connector produces per tile.
    seq_len = int((image_size // patch_size) ** 2 / scale**2)
    return Idefics3Settings(tiling, image_size, seq_len, pixels, tokens)


class Idefics3Processor(ItemProcessor):
    family = "idefics3"
    title = "Idefics3"
    model_types: tuple[str, ...] = ("idefics3",)
    options = Idefics3Options
    placeholder_text = IMAGE  # Idefics3ForConditionalGeneration.get_placeholder_str

    def __init__(self, settings: Idefics3Settings, image_token_id: int, tokenizer: Any) -> None:
        self.settings = settings
        self.defaults = settings.tiling
        self.image_token_id = image_token_id
        self.pipeline = PixelPipeline(settings.pixels)
        self._encode: Callable[[int, int], tuple[int, ...]] = functools.lru_cache(maxsize=64)(
            lambda rows, cols: tuple(
                tokenizer.encode(
                    replacement_text(rows, cols, settings.seq_len, settings.tokens),
                    add_special_tokens=False,
                ).ids
            )
        )

    @classmethod
    def matches(cls, files: ModelConfigs) -> bool:
        # A filter the shared resize cannot reproduce (NEAREST, BOX, HAMMING) leaves the model
        # to the engine workers' own processing rather than serving it with other pixels.
        return matches_model(files, cls.model_types, IMAGE_PROCESSORS) and (
            resample_method(files.preprocessor) is not None
        )

    @classmethod
    def image_tokens(cls, files: ModelConfigs) -> ImageTokens:
        """Idefics3Processor's token strings are fixed."""
        return ImageTokens()

    @classmethod
    def from_files(cls, files: ModelConfigs) -> Idefics3Processor:
        tokens = cls.image_tokens(files)
        token = files.config.get("image_token_id")
        if token is None:
            if tokens.image not in files.vocab:
                raise ModelConfigError(f"the tokenizer lacks the image token {tokens.image}")
            token = files.vocab[tokens.image]
        return cls(settings_from(files, tokens), int(token), files.tokenizer)

    @property
    def anchor_token_id(self) -> int:
        return self.image_token_id

    def settings_for(self, options: Idefics3Options) -> Idefics3Tiling:
        model = self.settings.tiling
        tile = (options.max_image_size and options.max_image_size.longest_edge) or model.tile
        if tile != self.settings.vision_image_size:
            raise OptionError(
                f"mm_processor_kwargs.max_image_size.longest_edge must be the model's tile "
                f"side {self.settings.vision_image_size}"
            )
        longest = (options.size and options.size.longest_edge) or model.longest_edge
        if longest % tile:
            raise OptionError(
                f"mm_processor_kwargs.size.longest_edge must be a multiple of the tile side {tile}"
            )
        split = options.do_image_splitting
        return Idefics3Tiling(model.do_image_splitting if split is None else split, longest, tile)

    def grid(self, height: int, width: int, tiling: Idefics3Tiling) -> Grid:
        """The image's tiles, checked against vLLM's count of them."""
        grid = pixel_grid(height, width, tiling)
        counted = vllm_rows_cols(height, width, tiling)
        if counted != (grid.rows, grid.cols):
            raise OptionError(
                f"a {width}x{height} image would be cut into {grid.rows}x{grid.cols} tiles "
                f"while vLLM counts {counted[0]}x{counted[1]}; change size.longest_edge"
            )
        return grid

    def process(
        self, images: Sequence[np.ndarray], settings: Idefics3Tiling, raw_pixels: bool
    ) -> ProcessedItems:
        grids = [self.grid(*image.shape[:2], settings) for image in images]
        counts = [grid.tiles for grid in grids]
        t = settings.tile
        planes = np.empty((sum(counts), 3, t, t), np.uint8)
        start = 0
        for image, grid, count in zip(images, grids, counts):
            self._tiles_into(image, grid, settings, planes[start : start + count])
            start += count
        if raw_pixels:
            pixels = planes
        elif self.pipeline.out_dtype(raw_pixels) is np.uint8:
            # neither rescaled nor normalized: transformers' padding step still makes floats
            pixels = planes.astype(np.float32)
        else:
            # SmolVLM's 13 tiles of 512px are 41 MB of floats: past malloc's reuse (OUTPUTS)
            pixels = self.pipeline.normalize(planes, native.OUTPUTS.empty(planes.shape, np.float32))
        return ProcessedItems(
            tensors={
                "pixel_values": pixels,
                MASK_KEY: np.ones((len(planes), t, t), np.int64),
                SIZES_KEY: np.asarray(counts, dtype=np.int64),
            },
            batched_keys=(SIZES_KEY,),
            flat_keys={"pixel_values": SIZES_KEY, MASK_KEY: SIZES_KEY},
            keep_on_cpu_keys=(SIZES_KEY,),
            replacements=[list(self._encode(grid.rows, grid.cols)) for grid in grids],
            embed_token_id=self.image_token_id,
        )

    def _tiles_into(
        self, image: np.ndarray, grid: Grid, tiling: Idefics3Tiling, out: np.ndarray
    ) -> None:
        """The image's tiles row by row, then its global tile, as uint8 channel planes into
        `out` (tiles, 3, T, T); each resize from the previous one's output, as transformers
        chains them."""
        t, method = tiling.tile, self.settings.pixels.method
        h1, w1 = longest_edge_size(*image.shape[:2], tiling.longest_edge)
        resized = resize_to(image, h1, w1, method)
        if grid.tiles == 1:  # not split, or no larger than a tile: resized to one
            tiles_into(resized, t, t, method, out[:1].reshape(1, 1, 3, t, t))
            return
        # The global tile is resized from the tile-multiple image, so that one is kept whole.
        resized = resize_to(resized, grid.height, grid.width, method)
        tiles_into(resized, grid.height, grid.width, method, out[:-1].reshape(
            grid.rows, grid.cols, 3, t, t
        ))  # fmt: skip
        tiles_into(resized, t, t, method, out[-1:].reshape(1, 1, 3, t, t))


class SmolVLMProcessor(Idefics3Processor):
    """SmolVLM: Idefics3's processing and replacement under another model_type, the token
    strings read as transformers' SmolVLMProcessor reads them (vLLM's SmolVLMProcessingInfo
    takes them from that processor)."""

    family = "smolvlm"
    title = "SmolVLM"
    model_types = ("smolvlm",)

    @classmethod
    def image_tokens(cls, files: ModelConfigs) -> ImageTokens:
        # getattr(tokenizer, "image_token", "<image>") and the like.
        named = files.named_tokens
        return ImageTokens(
            image=named.get("image_token", IMAGE),
            fake=named.get("fake_image_token", FAKE),
            global_tag=named.get("global_image_token", GLOBAL),
        )
