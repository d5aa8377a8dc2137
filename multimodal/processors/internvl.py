"""InternVL 3 / 3.5 in Hugging Face format (model_type `internvl`): dynamic tiles plus a
thumbnail, each tile 256 `<IMG_CONTEXT>` embeddings between `<img>` and `</img>`.

Mirrors transformers' GotOcr2ImageProcessor (torchvision backend) as InternVLProcessor calls
it: pick the tile grid whose aspect ratio is closest to the image's among all grids of
min_patches..max_patches tiles (ties go to more tiles until they cover over twice the image),
resize the whole image bicubic to that grid and cut it into tiles row by row, then append the
whole image resized to one tile as a thumbnail (only when there are several tiles); a 1x1
grid, or crop_to_patches off, is the image resized to one tile. Then fused rescale+normalize
(ImageNet mean/std in the released checkpoints). When the native kernels are built, the two
resizes write the tiles' channel planes directly (multimodal.native.tiles).

Where vLLM (interns1.py, which serves `InternVLForConditionalGeneration`) is the reference
over transformers:
- Tensors: all images' tiles concatenated, `pixel_values [sum(tiles), 3, T, T]`, cut per image
  by the flat key's sizes tensor `image_num_patches` (int64, kept on CPU), plus the shared
  `image_token_id` that vLLM's model reads; transformers returns only the pixels.
- Tiling is on by default: InternVLProcessor passes crop_to_patches=True whatever the
  checkpoint's preprocessor config says (the released ones say false), and vLLM calls it.
- Replacement: vLLM replaces the chat template's one `<IMG_CONTEXT>` per image with the ids of
  `<img>` + tiles * image_seq_length x `<IMG_CONTEXT>` + `</img>`; only the `<IMG_CONTEXT>`
  positions take embeddings (hence `embed_token_id`). Per tile, vLLM writes the processor's
  image_seq_length, which must be what its encoder produces, (image_size / patch_size)^2 *
  downsample_ratio^2: computed here from config.json (and checked against its own
  image_seq_length), as the processor's setting is not among the files a family reads.
- Options: the HF processor's tiling kwargs, which vLLM passes through. The remote-code
  format's names (max_dynamic_patch, dynamic_image_size...) are ignored by this processor
  in vLLM, so they are refused here rather than silently dropped.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
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
from multimodal.processors.options import first_set, option
from multimodal.processors.pixels import PixelPipeline, PixelSettings
from multimodal.processors.transforms import (
    CLIP_MEAN,
    CLIP_STD,
    RESAMPLE,
    channel_triple,
    tiles_into,
)

MODEL_TYPES = ("internvl",)
# The image processor InternVLProcessor is saved with (the Fast name in released checkpoints).
IMAGE_PROCESSORS = ("GotOcr2ImageProcessor",)
IMG_START, IMG_END, IMG_CONTEXT = "<img>", "</img>", "<IMG_CONTEXT>"
SIZES_KEY = "image_num_patches"  # vLLM's names for the per-image tile counts...
TOKEN_ID_KEY = "image_token_id"  # ...and the embedding token its model reads
# GotOcr2ImageProcessor's class defaults, for keys a preprocessor config leaves out.
DEFAULT_MIN_PATCHES, DEFAULT_MAX_PATCHES = 1, 12
DEFAULT_TILE = 384
# Far above any released setting (12); every tile is a few hundred tokens, and the grid search
# is quadratic in it, so a request cannot make one image cost unbounded work.
MOST_PATCHES = 256


@dataclass(frozen=True)
class InternVLOptions:
    """mm_processor_kwargs for InternVL images: GotOcr2ImageProcessor's tiling arguments."""

    crop_to_patches: bool | None = option(doc="tile the image (InternVLProcessor: on)")
    min_patches: int | None = option(minimum=1, doc="fewest tiles, thumbnail not counted")
    max_patches: int | None = option(minimum=1, doc="most tiles, thumbnail not counted")


@dataclass(frozen=True)
class Tiling:
    """How one request's images are tiled: its options over the model's defaults."""

    crop_to_patches: bool
    min_patches: int
    max_patches: int


@dataclass(frozen=True)
class InternVLSettings:
    """What the model's configs fix: tile size, tokens per tile, the replacement's tokens."""

    tile: int  # tiles are tile x tile pixels (the vision tower's image_size)
    tokens_per_tile: int
    defaults: Tiling
    context_id: int  # <IMG_CONTEXT>: the chat template's anchor and every embedding slot
    start_id: int  # <img>
    end_id: int  # </img>


@functools.lru_cache(maxsize=64)
def supported_grids(min_tiles: int, max_tiles: int) -> tuple[tuple[int, int], ...]:
    """transformers' get_all_supported_aspect_ratios: (columns, rows) of min..max tiles,
    sorted by tile count (stable, so equal counts keep the column-major order)."""
    grids = [
        (columns, rows)
        for columns in range(1, max_tiles + 1)
        for rows in range(1, max_tiles + 1)
        if min_tiles <= columns * rows <= max_tiles
    ]
    return tuple(sorted(grids, key=lambda grid: grid[0] * grid[1]))


def best_grid(
    height: int, width: int, tile: int, min_tiles: int, max_tiles: int
) -> tuple[int, int]:
    """transformers' get_optimal_tiled_canvas, to the float operation: (columns, rows) with
    the aspect ratio closest to the image's; on a tie the later (more tiles) wins while the
    image's area exceeds half the grid's."""
    aspect_ratio = width / height
    area = width * height
    best_ratio_diff, best = float("inf"), (1, 1)
    for grid in supported_grids(min_tiles, max_tiles):
        ratio_diff = abs(aspect_ratio - grid[0] / grid[1])
        if ratio_diff < best_ratio_diff:
            best_ratio_diff, best = ratio_diff, grid
        elif ratio_diff == best_ratio_diff and area > 0.5 * tile * tile * grid[0] * grid[1]:
            best = grid
    return best


def tile_grid(height: int, width: int, tile: int, tiling: Tiling) -> tuple[int, int] | None:
    """(columns, rows) of the tiles an image is cut into, or None for one tile (the image
    resized to a tile, no thumbnail)."""
    if not tiling.crop_to_patches:
        return None
    grid = best_grid(height, width, tile, tiling.min_patches, tiling.max_patches)
    return None if grid == (1, 1) else grid


def num_tiles(grid: tuple[int, int] | None) -> int:
    """Tiles in pixel_values for an image: the grid and its thumbnail, or the single tile."""
    return 1 if grid is None else grid[0] * grid[1] + 1


class InternVLProcessor(ItemProcessor):
    family = "internvl"
    title = "InternVL"
    options = InternVLOptions
    placeholder_text = IMG_CONTEXT  # InternS1ForConditionalGeneration.get_placeholder_str

    def __init__(self, settings: InternVLSettings, pixels: PixelPipeline) -> None:
        self.settings = settings
        self.defaults = settings.defaults
        self.pixels = pixels

    @classmethod
    def matches(cls, files: ModelConfigs) -> bool:
        return matches_model(files, MODEL_TYPES, IMAGE_PROCESSORS)

    @classmethod
    def from_files(cls, files: ModelConfigs) -> InternVLProcessor:
        pre = files.preprocessor
        tile = _tile_size(pre, files.config.get("vision_config") or {})
        settings = InternVLSettings(
            tile=tile,
            tokens_per_tile=_tokens_per_tile(files.config),
            defaults=Tiling(
                # InternVLProcessor's default, over the image processor's own (false as released)
                crop_to_patches=True,
                min_patches=int(pre.get("min_patches", DEFAULT_MIN_PATCHES)),
                max_patches=int(pre.get("max_patches", DEFAULT_MAX_PATCHES)),
            ),
            context_id=_token_id(files.vocab, IMG_CONTEXT),
            start_id=_token_id(files.vocab, IMG_START),
            end_id=_token_id(files.vocab, IMG_END),
        )
        return cls(settings, PixelPipeline(_pixel_settings(pre, tile)))

    @property
    def anchor_token_id(self) -> int:
        return self.settings.context_id

    def settings_for(self, options: InternVLOptions) -> Tiling:
        defaults = self.settings.defaults
        tiling = Tiling(
            crop_to_patches=first_set(options.crop_to_patches, defaults.crop_to_patches),
            min_patches=first_set(options.min_patches, defaults.min_patches),
            max_patches=first_set(options.max_patches, defaults.max_patches),
        )
        if tiling.max_patches > MOST_PATCHES:
            raise OptionError(f"mm_processor_kwargs.max_patches must be at most {MOST_PATCHES}")
        return tiling

    def num_image_tokens(self, height: int, width: int, tiling: Tiling | None = None) -> int:
        """The replacement's length for an image of this size, <img> and </img> included."""
        grid = tile_grid(height, width, self.settings.tile, tiling or self.settings.defaults)
        return num_tiles(grid) * self.settings.tokens_per_tile + 2

    def process(
        self, images: Sequence[np.ndarray], settings: Tiling, raw_pixels: bool
    ) -> ProcessedItems:
        t = self.settings.tile
        grids = [tile_grid(i.shape[0], i.shape[1], t, settings) for i in images]
        counts = [num_tiles(g) for g in grids]
        planes = np.empty((sum(counts), 3, t, t), np.uint8)
        start = 0
        for image, grid, count in zip(images, grids, counts):
            self._tiles_into(image, grid, planes[start : start + count])
            start += count
        if self.pixels.out_dtype(raw_pixels) is np.uint8:
            pixel_values = planes
        else:
            pixel_values = self.pixels.normalize(planes, np.empty(planes.shape, np.float32))
        s = self.settings
        return ProcessedItems(
            tensors={
                "pixel_values": pixel_values,
                SIZES_KEY: np.asarray(counts, dtype=np.int64),
                TOKEN_ID_KEY: np.asarray(s.context_id, dtype=np.int64),
            },
            batched_keys=(SIZES_KEY,),
            flat_keys={"pixel_values": SIZES_KEY},
            keep_on_cpu_keys=(SIZES_KEY, TOKEN_ID_KEY),
            replacements=[
                [s.start_id, *[s.context_id] * (n * s.tokens_per_tile), s.end_id] for n in counts
            ],
            embed_token_id=s.context_id,
        )

    def _tiles_into(self, image: np.ndarray, grid: tuple[int, int] | None, out: np.ndarray) -> None:
        """The image's tiles, then its thumbnail, as uint8 channel planes into `out`."""
        method, t = self.pixels.settings.method, self.settings.tile
        if grid is None:
            tiles_into(image, t, t, method, out.reshape(1, 1, 3, t, t))
            return
        columns, rows = grid
        tiles_into(image, rows * t, columns * t, method, out[:-1].reshape(rows, columns, 3, t, t))
        tiles_into(image, t, t, method, out[-1:].reshape(1, 1, 3, t, t))


def _tile_size(pre: Mapping[str, Any], vision: Mapping[str, Any]) -> int:
    size = pre.get("size") or {"height": DEFAULT_TILE, "width": DEFAULT_TILE}
    if not (size.get("height") and size.get("width")) or size["height"] != size["width"]:
        raise ModelConfigError(f"InternVL tiles must be square height x width, got size {size}")
    if not pre.get("do_resize", True):
        raise ModelConfigError("InternVL needs do_resize: every tile is the tower's input size")
    tile = int(size["height"])
    image_size = _pair(vision.get("image_size", (448, 448)))
    if image_size != (tile, tile):
        # vLLM's model checks every tile against the tower's image_size.
        raise ModelConfigError(f"tile size {tile} differs from the vision tower's {image_size}")
    return tile


def _tokens_per_tile(config: Mapping[str, Any]) -> int:
    """InternS1ForConditionalGeneration.num_image_token: the encoder's features per tile."""
    vision = config.get("vision_config") or {}
    image_size = _pair(vision.get("image_size", (448, 448)))[0]
    patch_size = _pair(vision.get("patch_size", (14, 14)))[0]
    ratio = float(config.get("downsample_ratio", 0.5))
    tokens = int((image_size // patch_size) ** 2 * (ratio**2))
    declared = config.get("image_seq_length")
    if declared is not None and int(declared) != tokens:
        raise ModelConfigError(
            f"image_seq_length {declared} differs from the encoder's {tokens} tokens per tile"
        )
    return tokens


def _pixel_settings(pre: Mapping[str, Any], tile: int) -> PixelSettings:
    resample = int(pre.get("resample", 3))
    if resample not in RESAMPLE:
        raise ModelConfigError(f"resample mode {resample} is not supported (bilinear or bicubic)")
    return PixelSettings(
        shortest_edge=None,
        resize_hw=(tile, tile),
        do_resize=True,
        crop_hw=None,
        pad_to_square=False,
        method=RESAMPLE[resample],
        do_rescale=bool(pre.get("do_rescale", True)),
        rescale_factor=float(pre.get("rescale_factor", 1 / 255)),
        do_normalize=bool(pre.get("do_normalize", True)),
        mean=channel_triple(pre.get("image_mean", CLIP_MEAN)),
        std=channel_triple(pre.get("image_std", CLIP_STD)),
    )


def _token_id(vocab: Mapping[str, int], token: str) -> int:
    token_id = vocab.get(token)
    if token_id is None:
        # vLLM encodes the replacement as text: without the added token it is not one id.
        raise ModelConfigError(f"the tokenizer has no {token} token")
    return int(token_id)


def _pair(value: Any) -> tuple[int, int]:
    if isinstance(value, (list, tuple)):
        return int(value[0]), int(value[1])
    return int(value), int(value)
