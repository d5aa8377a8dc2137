"""LLaVA-NeXT (LLaVA-1.6) images: "anyres" tiling into crops plus a whole-image base crop.

Mirrors transformers' LlavaNextImageProcessor (torchvision backend, which vLLM runs): pick the
best resolution from `image_grid_pinpoints`, resize keeping aspect (ceil, capped at the target)
and zero-pad centred to it, cut into crop-size tiles row by row, prepend the whole image resized
straight to size x size, then resize/crop/normalize every tile like CLIP. Images of one request
are zero-padded to the same tile count (padding added after normalization, as transformers does;
vLLM's model drops the extra tiles using `image_sizes`). When the tiles are already crop-sized
(the later resize and crop leave them alone) and the native kernels are built, the two resizes
write the tiles' channel planes directly (multimodal.native.tiles): the same bytes, without the
padded canvas or a transposing copy.

The `<image>` anchor becomes vLLM's LlavaNextProcessingInfo.get_num_image_tokens: base tokens
plus the unpadded tile features and one newline per feature row, computed with the same
`int(round(x, 7))` arithmetic as vLLM (and TGI), from the model config's pinpoints and tower.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from multimodal import native
from multimodal.processors.base import (
    ItemProcessor,
    ModelConfigError,
    ModelConfigs,
    ProcessedItems,
)
from multimodal.processors.llava import TowerSettings, family_matches, tower_settings
from multimodal.processors.options import NoOptions
from multimodal.processors.pixels import PixelPipeline, pixel_settings
from multimodal.processors.transforms import fit_within, pad, resize_to, select_best_resolution

MODEL_TYPES = ("llava_next",)
IMAGE_PROCESSORS = ("LlavaNextImageProcessor",)
# Both LlavaNextConfig's and LlavaNextImageProcessor's default pinpoints.
DEFAULT_PINPOINTS = ((336, 672), (672, 336), (672, 672), (1008, 336), (336, 1008))


@dataclass(frozen=True)
class AnyresSettings:
    pinpoints: tuple[tuple[int, int], ...]  # image processor's: decides the tiles
    base_hw: tuple[int, int]  # the whole image is resized straight to this
    tile: int  # tile side (crop_size.height)


@dataclass(frozen=True)
class AnyresLayout:
    """Where an image goes: fitted to height x width, centred at (top, left) on a zero-padded
    canvas of the best pinpoint's size, which is cut into tile x tile pieces."""

    height: int
    width: int
    top: int
    left: int
    canvas: tuple[int, int]
    tile: int

    @property
    def whole_tiles(self) -> bool:
        return self.canvas[0] % self.tile == 0 and self.canvas[1] % self.tile == 0

    @property
    def grid(self) -> tuple[int, int]:
        """Rows and columns of whole tiles on the canvas."""
        return self.canvas[0] // self.tile, self.canvas[1] // self.tile

    @property
    def tiles(self) -> int:
        """The canvas tiles and the base tile in front of them (whole tiles only)."""
        return 1 + self.grid[0] * self.grid[1]


def anyres_layout(height: int, width: int, anyres: AnyresSettings) -> AnyresLayout:
    """The best pinpoint for this image, and the image fitted and centred on it."""
    best_h, best_w = select_best_resolution(height, width, anyres.pinpoints)
    new_h, new_w = fit_within(height, width, best_h, best_w)
    return AnyresLayout(
        height=new_h,
        width=new_w,
        top=(best_h - new_h) // 2,
        left=(best_w - new_w) // 2,
        canvas=(best_h, best_w),
        tile=anyres.tile,
    )


def unpadded_features(
    height: int, width: int, npatches: int, num_patch_height: int, num_patch_width: int
) -> tuple[int, int]:
    """vLLM's LlavaNextProcessingInfo._get_num_unpadded_features, to the operation."""
    current_height = npatches * num_patch_height
    current_width = npatches * num_patch_width
    aspect_ratio = width / height
    current_aspect_ratio = current_width / current_height
    if aspect_ratio > current_aspect_ratio:
        new_height = int(round(height * (current_width / width), 7))
        padding = (current_height - new_height) // 2
        current_height = current_height - (2 * padding)
    else:
        new_width = int(round(width * (current_height / height), 7))
        padding = (current_width - new_width) // 2
        current_width = current_width - (2 * padding)
    return current_height * current_width, current_height


def num_image_tokens(
    height: int, width: int, tower: TowerSettings, pinpoints: Sequence[Sequence[int]]
) -> int:
    """vLLM's LlavaNextProcessingInfo.get_num_image_tokens for an image of this size."""
    best_h, best_w = select_best_resolution(height, width, pinpoints)
    unpadded, newlines = unpadded_features(
        height, width, tower.grid, best_h // tower.image_size, best_w // tower.image_size
    )
    return unpadded + newlines + tower.base_tokens()


class LlavaNextProcessor(ItemProcessor):
    family = "llava_next"
    title = "LLaVA-NeXT"
    placeholder_text = "<image>"

    def __init__(
        self,
        pixels: PixelPipeline,
        anyres: AnyresSettings,
        tower: TowerSettings,
        model_pinpoints: tuple[tuple[int, int], ...],
    ) -> None:
        self.pixels = pixels
        self.anyres = anyres
        self.tower = tower
        self.model_pinpoints = model_pinpoints  # config.json's: what vLLM counts tokens with
        # Tiles come out of resize_and_crop untouched, base included: the native kernels can
        # write them straight from the two resizes.
        square = (anyres.tile, anyres.tile)
        self._tiles_kept = pixels.keeps(*square) and anyres.base_hw == square

    @classmethod
    def matches(cls, files: ModelConfigs) -> bool:
        return family_matches(files, MODEL_TYPES, IMAGE_PROCESSORS)

    @classmethod
    def from_files(cls, files: ModelConfigs) -> LlavaNextProcessor:
        pre = files.preprocessor
        # LlavaNextImageProcessor's do_pad pads the tile count for batching, not to a square.
        settings = pixel_settings({**pre, "do_pad": False})
        size = pre.get("size") or {"shortest_edge": 224}
        crop = pre.get("crop_size") or {"height": 224, "width": 224}
        if size.get("height") and size.get("width"):
            base_hw = (int(size["height"]), int(size["width"]))
        else:
            base_hw = (int(size["shortest_edge"]),) * 2
        tile = int(crop.get("height") or size.get("height") or size["shortest_edge"])
        anyres = AnyresSettings(
            pinpoints=_pinpoints(pre.get("image_grid_pinpoints")),
            base_hw=base_hw,
            tile=tile,
        )
        return cls(
            PixelPipeline(settings),
            anyres,
            tower_settings(files),
            _pinpoints(files.config.get("image_grid_pinpoints")),
        )

    @property
    def anchor_token_id(self) -> int:
        return self.tower.image_token_id

    def num_image_tokens(self, height: int, width: int) -> int:
        return num_image_tokens(height, width, self.tower, self.model_pinpoints)

    def process(
        self, images: Sequence[np.ndarray], settings: NoOptions, raw_pixels: bool
    ) -> ProcessedItems:
        layouts = [anyres_layout(*i.shape[:2], self.anyres) for i in images]
        if native.AVAILABLE and self._tiles_kept and all(t.whole_tiles for t in layouts):
            batch = self._batch_from_tiles(images, layouts, raw_pixels)
        else:
            batch = self._batch_step_by_step(images, layouts, raw_pixels)
        sizes = [(int(i.shape[0]), int(i.shape[1])) for i in images]
        token = self.tower.image_token_id
        return ProcessedItems(
            tensors={
                "pixel_values": batch,
                "image_sizes": np.asarray(sizes, dtype=np.int64).reshape(len(images), 2),
            },
            batched_keys=("pixel_values", "image_sizes"),
            keep_on_cpu_keys=("image_sizes",),
            replacements=[[token] * self.num_image_tokens(h, w) for h, w in sizes],
        )

    def _batch_from_tiles(
        self, images: Sequence[np.ndarray], layouts: Sequence[AnyresLayout], raw_pixels: bool
    ) -> np.ndarray:
        """Each image resized twice (base, fitted) by the native kernels straight into its
        tiles' channel planes: no padded canvas, no transposing copy."""
        counts = [layout.tiles for layout in layouts]
        most, t = max(counts), self.anyres.tile
        # Only a ragged batch needs zero padding (added after normalization, as transformers).
        alloc = np.empty if min(counts) == most else np.zeros
        planes = alloc((len(images), most, 3, t, t), np.uint8)
        for image, layout, out in zip(images, layouts, planes):
            self._tiles_into(image, layout, out)
        if self.pixels.out_dtype(raw_pixels) is np.uint8:
            return planes
        batch = alloc(planes.shape, np.float32)
        for count, image_planes, out in zip(counts, planes, batch):
            self.pixels.normalize(image_planes[:count], out[:count])
        return batch

    def _tiles_into(self, image: np.ndarray, layout: AnyresLayout, out: np.ndarray) -> None:
        method, t = self.pixels.settings.method, self.anyres.tile
        if (layout.height, layout.width) == (t, t):  # the fitted image is the base: resize once
            image = resize_to(image, t, t, method)
        native.tiles(image, t, t, method, out[:1].reshape(1, 1, 3, t, t))
        grid = out[1 : layout.tiles].reshape(*layout.grid, 3, t, t)
        native.tiles(image, layout.height, layout.width, method, grid, layout.top, layout.left)

    def _batch_step_by_step(
        self, images: Sequence[np.ndarray], layouts: Sequence[AnyresLayout], raw_pixels: bool
    ) -> np.ndarray:
        """transformers' steps one by one: without the native kernels, or when a tile is
        resized or cropped once more."""
        tiles = [self._tiles(image, layout) for image, layout in zip(images, layouts)]
        shapes = {t.shape for image_tiles in tiles for t in image_tiles}
        if len(shapes) != 1:
            raise ModelConfigError(f"tiles differ in size: {sorted(shapes)}")
        h, w, c = shapes.pop()
        counts = [len(t) for t in tiles]
        most = max(counts)
        # Tiles are finished straight into the batch; only a ragged batch needs zero padding.
        alloc = np.empty if min(counts) == most else np.zeros
        batch = alloc((len(tiles), most, c, h, w), dtype=self.pixels.out_dtype(raw_pixels))
        for image_tiles, out in zip(tiles, batch):
            for tile, tile_out in zip(image_tiles, out):
                self.pixels.finish(tile, raw_pixels, tile_out)
        return batch

    def _tiles(self, image: np.ndarray, layout: AnyresLayout) -> list[np.ndarray]:
        """The base image and the anyres tiles, resized and cropped, still HWC uint8."""
        a, method = self.anyres, self.pixels.settings.method
        fitted = resize_to(image, layout.height, layout.width, method)
        canvas_h, canvas_w = layout.canvas
        right, bottom = canvas_w - layout.width - layout.left, canvas_h - layout.height - layout.top
        canvas = pad(fitted, layout.left, layout.top, right, bottom)
        tiles = [resize_to(image, *a.base_hw, method)]
        tiles += [
            canvas[y : y + a.tile, x : x + a.tile]
            for y in range(0, canvas_h, a.tile)
            for x in range(0, canvas_w, a.tile)
        ]
        return [self.pixels.resize_and_crop(t) for t in tiles]


def _pinpoints(value: Any) -> tuple[tuple[int, int], ...]:
    if value is None:
        return DEFAULT_PINPOINTS
    pinpoints = tuple((int(h), int(w)) for h, w in value)
    if not pinpoints:
        raise ModelConfigError("image_grid_pinpoints is empty")
    return pinpoints
