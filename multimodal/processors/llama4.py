"""Llama 4 images: aspect-ratio tiling into square tiles, a global tile, bfloat16 normalization.

Mirrors transformers' Llama4ImageProcessor (torchvision backend) as vLLM's
Llama4ForConditionalGeneration runs it (vllm/model_executor/models/mllama4.py):

- the canvas: of the resolutions made of at most `max_patches` tiles (`size`, 336px), the one
  needing the least upscaling, else the least downscaling, smallest area on a tie
  (get_best_fit, whose scales torch computes in float32: reproduced in float32 here, since a
  float64 scale picks another canvas for some sizes);
- the image resized (bilinear, antialiased) to fit the canvas without distortion, upscaled no
  further than the tile size unless `resize_to_max_canvas`, zero-padded right and bottom, cut
  into tiles row by row; when there is more than one tile, the whole image resized to one tile
  is appended (the global tile);
- rescale and normalize in bfloat16, rounding after each torch operation: every uint8 value
  maps to one float per channel, so a table per channel gives the exact result (looked up a
  pair of pixels at a time). Floats are sent as float32 holding those bfloat16 values (the
  engine casts to its dtype, as vLLM casts the processor's bfloat16 output). vLLM 0.32 does
  not normalize Llama 4 pixels on device; raw uint8 (`raw_pixels`) is what transformers gives
  without rescale and normalize.

The tensors follow vLLM's `_get_mm_fields_config`: `pixel_values` (tiles, 3, T, T) flat with a
per-image `patches_per_image` sizes tensor, and `aspect_ratios` (images, 2) as (rows, cols),
both kept on CPU. Where vLLM and transformers differ, vLLM wins: the replacement is vLLM's
(`<|image_start|>`, per tile row `<|patch|>` runs split by `<|tile_x_separator|>` and ended by
`<|tile_y_separator|>` when tiled, then `<|image|>`, the global tile's `<|patch|>` run,
`<|image_end|>`), with tokens per tile from the vision config ((image_size / patch_size)^2 over
the pixel-shuffle factor; transformers counts from its processor's patch_size) and aspect
ratios on vLLM's tile size (the vision config's image_size, which must equal the processor's
tile size). The chat template writes one `<|image|>` per image, which becomes the whole
replacement; only the `<|patch|>` positions take embeddings (`embed_token_id`).

Options: `resize_to_max_canvas` only. vLLM also passes `max_patches` through to transformers
per request, but counts the image's tiles and tokens with the model's default, so the pixels
and the placeholder disagree: it is refused here.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from multimodal.processors.base import (
    ItemProcessor,
    ModelConfigError,
    ModelConfigs,
    ProcessedItems,
    matches_model,
)
from multimodal.processors.options import option
from multimodal.processors.transforms import RESAMPLE, channel_triple, tiles_into

MODEL_TYPES = ("llama4",)
IMAGE_PROCESSORS = ("Llama4ImageProcessor",)
SIZES_KEY = "patches_per_image"
RATIOS_KEY = "aspect_ratios"
# The strings transformers' Llama4Processor._prompt_split_image writes (fixed there, whatever
# the processor's token attributes say) and the anchor its image_token defaults to.
IMAGE_START = "<|image_start|>"
IMAGE_END = "<|image_end|>"
IMAGE = "<|image|>"
PATCH = "<|patch|>"
TILE_X = "<|tile_x_separator|>"
TILE_Y = "<|tile_y_separator|>"
# Llama4ImageProcessor's and Llama4VisionConfig's defaults.
DEFAULT_TILE = 336
DEFAULT_MAX_PATCHES = 16
DEFAULT_VISION = {"image_size": 448, "patch_size": 14, "pixel_shuffle_ratio": 0.5}


@dataclass(frozen=True)
class Llama4Options:
    """mm_processor_kwargs for Llama 4 images."""

    resize_to_max_canvas: bool | None = option(
        doc="upscale to the largest canvas of max_patches tiles instead of the smallest"
    )


@dataclass(frozen=True)
class Llama4Tiling:
    """What one request's images are tiled with: its options over the model's."""

    max_patches: int
    resize_to_max_canvas: bool


@dataclass(frozen=True)
class Llama4Settings:
    tile: int  # tile side in pixels: the processor's size, the vision tower's image_size
    max_patches: int
    resize_to_max_canvas: bool
    method: str
    do_rescale: bool
    rescale_factor: float
    do_normalize: bool
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    tokens_per_tile: int


@dataclass(frozen=True)
class TokenIds:
    image_start: int
    image_end: int
    image: int
    patch: int
    tile_x: int
    tile_y: int


@dataclass(frozen=True)
class TileLayout:
    """An image resized to height x width at the top left of a zero canvas of rows x cols
    tiles; `tiles` counts the global tile too."""

    height: int
    width: int
    rows: int
    cols: int

    @property
    def tiles(self) -> int:
        grid = self.rows * self.cols
        return grid if grid == 1 else grid + 1


@lru_cache(maxsize=16)
def supported_resolutions(max_patches: int, tile: int) -> tuple[tuple[int, int], ...]:
    """transformers' find_supported_resolutions: canvases of at most `max_patches` tiles,
    grouped by aspect ratio in the order it first meets each ratio (ties resolve by order)."""
    by_ratio: dict[float, list[tuple[int, int]]] = {}
    for count in range(max_patches, 0, -1):
        for rows in sorted(_factors(count)):
            by_ratio.setdefault(rows / (count // rows), []).append((rows, count // rows))
    return tuple((r * tile, c * tile) for group in by_ratio.values() for r, c in group)


def _factors(n: int) -> set[int]:
    found = set()
    for i in range(1, int(n**0.5) + 1):
        if n % i == 0:
            found.update((i, n // i))
    return found


def best_fit(
    height: int, width: int, resolutions: Sequence[tuple[int, int]], to_max_canvas: bool
) -> tuple[int, int]:
    """transformers' get_best_fit (also vLLM's aspect ratios), its scales in float32 as torch
    divides an int64 tensor by an int."""
    canvases = np.asarray(resolutions, dtype=np.int64)
    scale_h = canvases[:, 0].astype(np.float32) / np.float32(height)
    scale_w = canvases[:, 1].astype(np.float32) / np.float32(width)
    scales = np.where(scale_h > scale_w, scale_w, scale_h)
    upscaling = scales[scales >= 1]
    if upscaling.size:
        chosen = upscaling.max() if to_max_canvas else upscaling.min()
    else:
        chosen = scales[scales < 1].max()
    candidates = canvases[scales == chosen]
    best = candidates[np.argmin(candidates[:, 0] * candidates[:, 1])]
    return int(best[0]), int(best[1])


def fitted_size(
    height: int, width: int, canvas: tuple[int, int], tile: int, to_max_canvas: bool
) -> tuple[int, int]:
    """The size the image is resized to before padding to `canvas`: transformers'
    get_max_res_without_distortion on its upscaling-capped target.

    A target side is a torch scalar where transformers took it from the canvas tensor (all
    of it with `to_max_canvas`, else a side that min() picked from the canvas), a Python int
    otherwise; a torch scalar turns the division, comparison and product into float32 ones.
    """
    if to_max_canvas:
        (target_h, f32_h), (target_w, f32_w) = (canvas[0], True), (canvas[1], True)
    else:
        (target_h, f32_h) = _capped(max(height, tile), canvas[0])
        (target_w, f32_w) = _capped(max(width, tile), canvas[1])
    scale_w, scale_h = _divide(target_w, width, f32_w), _divide(target_h, height, f32_h)
    if _less(scale_w, f32_w, scale_h, f32_h):
        new_h, new_w = min(_floor_times(height, scale_w, f32_w), target_h), target_w
    else:
        new_h, new_w = target_h, min(_floor_times(width, scale_h, f32_h), target_w)
    return max(new_h, 1), max(new_w, 1)


def _capped(side: int, canvas_side: int) -> tuple[int, bool]:
    """min(side, canvas side) and whether it is the canvas's (torch) scalar: min() keeps its
    first argument unless the second is smaller."""
    return (canvas_side, True) if canvas_side < side else (side, False)


def _divide(numerator: int, denominator: int, f32: bool) -> float:
    if f32:
        return float(np.float32(numerator) / np.float32(denominator))
    return numerator / denominator


def _less(a: float, a_f32: bool, b: float, b_f32: bool) -> bool:
    # A comparison with a float32 tensor rounds a Python float operand to float32 first.
    if a_f32 or b_f32:
        return bool(np.float32(a) < np.float32(b))
    return a < b


def _floor_times(size: int, scale: float, f32: bool) -> int:
    if f32:
        return math.floor(float(np.float32(size) * np.float32(scale)))
    return math.floor(size * scale)


def tile_layout(height: int, width: int, tile: int, tiling: Llama4Tiling) -> TileLayout:
    """Where an image of this size goes: its canvas of tiles and its size on it."""
    to_max = tiling.resize_to_max_canvas
    canvas = best_fit(height, width, supported_resolutions(tiling.max_patches, tile), to_max)
    new_h, new_w = fitted_size(height, width, canvas, tile, to_max)
    return TileLayout(new_h, new_w, canvas[0] // tile, canvas[1] // tile)


def replacement(rows: int, cols: int, tokens_per_tile: int, ids: TokenIds) -> list[int]:
    """transformers' Llama4Processor._prompt_split_image for rows x cols tiles, as token ids
    (what vLLM's replacement tokenizes)."""
    patches = [ids.patch] * tokens_per_tile
    out = [ids.image_start]
    if rows * cols > 1:
        row = patches + ([ids.tile_x] + patches) * (cols - 1) + [ids.tile_y]
        out += row * rows
    return out + [ids.image] + patches + [ids.image_end]


def bfloat16(values: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (nearest even), as float32: what torch stores after
    each bfloat16 operation."""
    bits = np.asarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)


def normalization_table(s: Llama4Settings) -> np.ndarray:
    """(3, 256) float32: each channel's output for every uint8 value, as
    Llama4ImageProcessor.rescale_and_normalize computes it (bfloat16 when it does both)."""
    values = np.arange(256, dtype=np.float32)
    if s.do_rescale and s.do_normalize:
        # x.to(bfloat16) * rescale_factor, then torchvision's normalize on the bfloat16
        # tensor: sub(mean) and div(std) with mean and std as bfloat16, each rounded.
        scaled = bfloat16(values * np.float32(s.rescale_factor))
        rows = [
            bfloat16(bfloat16(scaled - bfloat16(np.float32(m))) / bfloat16(np.float32(d)))
            for m, d in zip(s.mean, s.std)
        ]
    else:  # rescale alone: uint8 * float in float32 (neither: process keeps uint8)
        rows = [values * np.float32(s.rescale_factor)] * 3
    return np.stack(rows).astype(np.float32)


def pair_tables(table: np.ndarray) -> np.ndarray | None:
    """Each channel's table over pairs of neighbouring pixels: entry a + 256 b holds the floats
    of a then b, as one uint64. Looked up through a uint16 view of the pixels, half as many
    gathers as one per pixel (2.5 vs 6 ms for 13 tiles): numpy's take does not vectorize.
    One table when every channel has the same; None on a big-endian machine."""
    if sys.byteorder != "little":
        return None
    distinct = table[:1] if (table == table[0]).all() else table
    low, high = np.arange(65536) & 0xFF, np.arange(65536) >> 8
    pairs = np.stack([distinct[:, low], distinct[:, high]], axis=-1)  # (channels, 65536, 2)
    return np.ascontiguousarray(pairs, dtype=np.float32).view(np.uint64)[..., 0]


def settings_from(files: ModelConfigs) -> Llama4Settings:
    pre, config = files.preprocessor, files.config
    vision = {**DEFAULT_VISION, **(config.get("vision_config") or {})}
    size = pre.get("size") or {"height": DEFAULT_TILE, "width": DEFAULT_TILE}
    tile = int(size.get("height", DEFAULT_TILE))
    if int(size.get("width", tile)) != tile:
        raise ModelConfigError(f"Llama 4 tiles must be square, got size {size}")
    image_size, patch_size = int(vision["image_size"]), int(vision["patch_size"])
    if image_size != tile:
        # vLLM counts tiles on the tower's image_size, transformers cuts them on `size`.
        raise ModelConfigError(f"tile size {tile} differs from the vision image_size {image_size}")
    if image_size % patch_size:
        raise ModelConfigError(f"image_size {image_size} is not a multiple of {patch_size}")
    if not pre.get("do_resize", True):
        raise ModelConfigError("Llama 4 always resizes images (do_resize false is refused)")
    resample = int(pre.get("resample", 2))
    if resample not in RESAMPLE:
        raise ModelConfigError(f"resample mode {resample} is not supported (bilinear or bicubic)")
    do_rescale, do_normalize = (
        bool(pre.get("do_rescale", True)),
        bool(pre.get("do_normalize", True)),
    )
    if do_normalize and not do_rescale:
        raise ModelConfigError("normalizing without rescaling is not supported")
    # vLLM's get_patch_per_chunk: patches per tile over the pixel-shuffle factor.
    shuffle = int(round(1.0 / (float(vision["pixel_shuffle_ratio"]) ** 2)))
    return Llama4Settings(
        tile=tile,
        max_patches=int(pre.get("max_patches", DEFAULT_MAX_PATCHES)),
        resize_to_max_canvas=bool(pre.get("resize_to_max_canvas", False)),
        method=RESAMPLE[resample],
        do_rescale=do_rescale,
        rescale_factor=float(pre.get("rescale_factor", 1 / 255)),
        do_normalize=do_normalize,
        mean=channel_triple(pre.get("image_mean", 0.5)),
        std=channel_triple(pre.get("image_std", 0.5)),
        tokens_per_tile=(image_size // patch_size) ** 2 // shuffle,
    )


def token_ids(vocab: Any) -> TokenIds:
    names = (IMAGE_START, IMAGE_END, IMAGE, PATCH, TILE_X, TILE_Y)
    missing = [n for n in names if n not in vocab]
    if missing:
        raise ModelConfigError(f"the tokenizer lacks Llama 4's image tokens {missing}")
    return TokenIds(*(int(vocab[n]) for n in names))


class Llama4Processor(ItemProcessor):
    family = "llama4"
    title = "Llama 4"
    options = Llama4Options
    placeholder_text = IMAGE  # Llama4ForConditionalGeneration.get_placeholder_str

    def __init__(self, settings: Llama4Settings, ids: TokenIds) -> None:
        self.settings = settings
        self.ids = ids
        self.defaults = Llama4Tiling(settings.max_patches, settings.resize_to_max_canvas)
        self._table = normalization_table(settings)
        self._pairs = pair_tables(self._table) if settings.tile % 2 == 0 else None

    @classmethod
    def matches(cls, files: ModelConfigs) -> bool:
        return matches_model(files, MODEL_TYPES, IMAGE_PROCESSORS)

    @classmethod
    def from_files(cls, files: ModelConfigs) -> Llama4Processor:
        return cls(settings_from(files), token_ids(files.vocab))

    @property
    def anchor_token_id(self) -> int:
        return self.ids.image

    def settings_for(self, options: Llama4Options) -> Llama4Tiling:
        if options.resize_to_max_canvas is None:
            return self.defaults
        return Llama4Tiling(self.settings.max_patches, options.resize_to_max_canvas)

    def layout(self, height: int, width: int, tiling: Llama4Tiling) -> TileLayout:
        return tile_layout(height, width, self.settings.tile, tiling)

    def process(
        self, images: Sequence[np.ndarray], settings: Llama4Tiling, raw_pixels: bool
    ) -> ProcessedItems:
        layouts = [self.layout(*image.shape[:2], settings) for image in images]
        floats = not raw_pixels and (self.settings.do_rescale or self.settings.do_normalize)
        counts = [layout.tiles for layout in layouts]
        t = self.settings.tile
        planes = np.empty((sum(counts), 3, t, t), np.uint8)
        start = 0
        for image, layout, count in zip(images, layouts, counts):
            self._tiles_into(image, layout, planes[start : start + count])
            start += count
        return ProcessedItems(
            tensors={
                # transformers leaves them uint8 with neither rescale nor normalize
                "pixel_values": self._normalized(planes) if floats else planes,
                SIZES_KEY: np.asarray(counts, dtype=np.int64),
                RATIOS_KEY: np.asarray(
                    [(lay.rows, lay.cols) for lay in layouts], dtype=np.int64
                ).reshape(len(images), 2),
            },
            batched_keys=(SIZES_KEY, RATIOS_KEY),
            flat_keys={"pixel_values": SIZES_KEY},
            keep_on_cpu_keys=(SIZES_KEY, RATIOS_KEY),
            replacements=[
                replacement(lay.rows, lay.cols, self.settings.tokens_per_tile, self.ids)
                for lay in layouts
            ],
            embed_token_id=self.ids.patch,
        )

    def _tiles_into(self, image: np.ndarray, layout: TileLayout, out: np.ndarray) -> None:
        """The image's canvas tiles (row by row) and its global tile, as uint8 channel
        planes, into `out` (tiles, 3, T, T)."""
        t, method = self.settings.tile, self.settings.method
        grid = out[: layout.rows * layout.cols].reshape(layout.rows, layout.cols, 3, t, t)
        tiles_into(image, layout.height, layout.width, method, grid)
        if layout.tiles > 1:
            tiles_into(image, t, t, method, out[-1:].reshape(1, 1, 3, t, t))

    def _normalized(self, planes: np.ndarray) -> np.ndarray:
        """uint8 planes (tiles, 3, T, T) to float32 by each channel's table."""
        out = np.empty(planes.shape, np.float32)
        if self._pairs is None:
            for channel in range(3):
                np.take(self._table[channel], planes[:, channel], out=out[:, channel], mode="clip")
        elif len(self._pairs) == 1:  # one table for all channels (Llama 4's mean = std = 0.5)
            np.take(self._pairs[0], planes.view(np.uint16), out=out.view(np.uint64), mode="clip")
        else:
            for channel, pairs in enumerate(self._pairs):
                index, into = planes[:, channel].view(np.uint16), out[:, channel].view(np.uint64)
                np.take(pairs, index, out=into, mode="clip")
        return out
