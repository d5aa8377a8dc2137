"""LLaVA-NeXT (LLaVA-1.6) images: "anyres" tiling into crops plus a whole-image base crop.

Mirrors transformers' LlavaNextImageProcessor (torchvision backend, which vLLM runs): pick the
best resolution from `image_grid_pinpoints`, resize keeping aspect (ceil, capped at the target)
and zero-pad centred to it, cut into crop-size tiles row by row, prepend the whole image resized
straight to size x size, then resize/crop/normalize every tile like CLIP. Images of one request
are zero-padded to the same tile count (padding added after normalization, as transformers does;
vLLM's model drops the extra tiles using `image_sizes`).

The `<image>` anchor becomes vLLM's LlavaNextProcessingInfo.get_num_image_tokens: base tokens
plus the unpadded tile features and one newline per feature row, computed with the same
`int(round(x, 7))` arithmetic as vLLM (and TGI), from the model config's pinpoints and tower.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from multimodal.processors.base import ImageProcessor, ModelFiles, ProcessedImages
from multimodal.processors.llava import (
    ModelConfigError,
    PixelPipeline,
    TowerSettings,
    family_matches,
    no_options,
    pad,
    pixel_settings,
    resize_to,
    tower_settings,
)

MODEL_TYPES = ("llava_next",)
IMAGE_PROCESSORS = ("LlavaNextImageProcessor",)
# Both LlavaNextConfig's and LlavaNextImageProcessor's default pinpoints.
DEFAULT_PINPOINTS = ((336, 672), (672, 336), (672, 672), (1008, 336), (336, 1008))


@dataclass(frozen=True)
class AnyresSettings:
    pinpoints: tuple[tuple[int, int], ...]  # image processor's: decides the tiles
    base_hw: tuple[int, int]  # the whole image is resized straight to this
    tile: int  # tile side (crop_size.height)


def select_best_resolution(
    height: int, width: int, resolutions: Sequence[Sequence[int]]
) -> tuple[int, int]:
    """transformers' select_best_resolution: most effective pixels, then least waste."""
    best, best_effective, best_waste = None, 0, float("inf")
    for res_h, res_w in resolutions:
        scale = min(res_w / width, res_h / height)
        down_w, down_h = int(width * scale), int(height * scale)
        effective = min(down_w * down_h, width * height)
        waste = res_w * res_h - effective
        if effective > best_effective or (effective == best_effective and waste < best_waste):
            best, best_effective, best_waste = (res_h, res_w), effective, waste
    if best is None:
        raise ModelConfigError("image_grid_pinpoints is empty")
    return best


def patch_output_size(height: int, width: int, target_h: int, target_w: int) -> tuple[int, int]:
    """transformers' get_patch_output_size: fit inside the target keeping aspect, ceil."""
    scale_w, scale_h = target_w / width, target_h / height
    if scale_w < scale_h:
        return min(math.ceil(height * scale_w), target_h), target_w
    return target_h, min(math.ceil(width * scale_h), target_w)


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


class LlavaNextProcessor(ImageProcessor):
    family = "llava_next"
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

    @classmethod
    def matches(cls, files: ModelFiles) -> bool:
        return family_matches(files, MODEL_TYPES, IMAGE_PROCESSORS)

    @classmethod
    def from_files(cls, files: ModelFiles) -> LlavaNextProcessor:
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

    def resolve_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        return no_options(options, "LLaVA-NeXT")

    def process(
        self, images: Sequence[np.ndarray], options: Mapping[str, Any], raw_pixels: bool
    ) -> ProcessedImages:
        self.resolve_options(options)
        tiles = [self._tiles(image) for image in images]
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
        sizes = [(int(i.shape[0]), int(i.shape[1])) for i in images]
        token = self.tower.image_token_id
        return ProcessedImages(
            tensors={
                "pixel_values": batch,
                "image_sizes": np.asarray(sizes, dtype=np.int64).reshape(len(images), 2),
            },
            batched_keys=("pixel_values", "image_sizes"),
            keep_on_cpu_keys=("image_sizes",),
            replacements=[[token] * self.num_image_tokens(h, w) for h, w in sizes],
        )

    def _tiles(self, image: np.ndarray) -> list[np.ndarray]:
        """The base image and the anyres tiles, resized and cropped, still HWC uint8."""
        a, method = self.anyres, self.pixels.settings.method
        height, width = image.shape[:2]
        best_h, best_w = select_best_resolution(height, width, a.pinpoints)
        new_h, new_w = patch_output_size(height, width, best_h, best_w)
        fitted = resize_to(image, new_h, new_w, method)
        left, extra_x = divmod(best_w - new_w, 2)
        top, extra_y = divmod(best_h - new_h, 2)
        canvas = pad(fitted, left, top, left + extra_x, top + extra_y)
        tiles = [resize_to(image, *a.base_hw, method)]
        tiles += [
            canvas[y : y + a.tile, x : x + a.tile]
            for y in range(0, best_h, a.tile)
            for x in range(0, best_w, a.tile)
        ]
        return [self.pixels.resize_and_crop(t) for t in tiles]


def _pinpoints(value: Any) -> tuple[tuple[int, int], ...]:
    if value is None:
        return DEFAULT_PINPOINTS
    pinpoints = tuple((int(h), int(w)) for h, w in value)
    if not pinpoints:
        raise ModelConfigError("image_grid_pinpoints is empty")
    return pinpoints
