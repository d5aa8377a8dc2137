"""Qwen2-VL, Qwen2.5-VL and Qwen3-VL images: smart resize, temporal duplication, patch grids.

Mirrors transformers' Qwen2VLImageProcessor (torchvision backend, which vLLM runs): resize to
multiples of patch*merge within [min_pixels, max_pixels], bicubic; optional rescale+normalize;
each patch flattened as (channel, temporal copy, row, column); `<|image_pad|>` repeated
t*h*w / merge^2 times per image. Qwen3-VL differs only in its numbers (patch 16, mean/std 0.5),
which come from the model's preprocessor config.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from multimodal import native
from multimodal.processors.base import ItemProcessor, ModelConfigs, ProcessedItems
from multimodal.processors.options import OptionError, first_set, option
from multimodal.processors.transforms import CLIP_MEAN, CLIP_STD, fused_normalization
from multimodal.resize import BACKENDS, DEFAULT_BACKEND, resize

MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe")
SIZES_KEY = "patches_per_image"
MAX_ASPECT_RATIO = 200


@dataclass(frozen=True)
class QwenVLSize:
    """The `size` object of Qwen2VLImageProcessor: min and max pixels by another name."""

    shortest_edge: int | None = option(minimum=1, doc="min_pixels")
    longest_edge: int | None = option(minimum=1, doc="max_pixels")


@dataclass(frozen=True)
class QwenVLOptions:
    """mm_processor_kwargs for Qwen2-VL, Qwen2.5-VL and Qwen3-VL images. Zero is refused for
    both bounds, as transformers' resize refuses a falsy shortest or longest edge."""

    min_pixels: int | None = option(minimum=1, doc="fewest pixels after the resize")
    max_pixels: int | None = option(minimum=1, doc="most pixels after the resize")
    size: QwenVLSize | None = None  # min_pixels / max_pixels win over it


@dataclass(frozen=True)
class QwenVLResize:
    """What one request's images are resized within: its options over the model's."""

    min_pixels: int
    max_pixels: int


@dataclass(frozen=True)
class QwenVLSettings:
    patch_size: int
    merge_size: int
    temporal_patch_size: int
    min_pixels: int
    max_pixels: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    rescale_factor: float
    image_token_id: int


def smart_resize(
    height: int, width: int, factor: int, min_pixels: int, max_pixels: int, frames: int = 1
) -> tuple[int, int]:
    """transformers' smart_resize, to the operation (Python's round() is banker's rounding).

    `frames` > 1 is GLM-4.xV's variant: the pixel bounds hold for frames x height x width (a
    still image counts its temporal copies); at 1 every product below is Qwen's own.
    """
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise OptionError(
            f"image aspect ratio {max(height, width) / min(height, width):.0f} exceeds "
            f"{MAX_ASPECT_RATIO}"
        )
    return _fit(height, width, factor, min_pixels, max_pixels, frames, frames)


def video_smart_resize(
    frames: int,
    height: int,
    width: int,
    temporal: int,
    factor: int,
    min_pixels: int,
    max_pixels: int,
) -> tuple[int, int]:
    """transformers' video smart_resize of Qwen3-VL and GLM-4.1V (the same operations in
    both): a side under `factor` scaled up first (int()); the pixel bounds hold for
    round(frames / temporal) * temporal frames (Python's banker's round), the shrink or
    growth is by `frames` itself. Callers refuse fewer frames than `temporal` first."""
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise OptionError(
            f"video aspect ratio {max(height, width) / min(height, width):.0f} exceeds "
            f"{MAX_ASPECT_RATIO}"
        )
    return _fit(
        height, width, factor, min_pixels, max_pixels, round(frames / temporal) * temporal, frames
    )


def _fit(
    height: int,
    width: int,
    factor: int,
    min_pixels: int,
    max_pixels: int,
    bound_frames: int,
    frames: int,
) -> tuple[int, int]:
    """The rule every smart_resize shares: sides rounded to `factor`, then scaled down or up
    when `bound_frames` x h x w leaves [min_pixels, max_pixels], by `frames` x h x w."""
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if bound_frames * h_bar * w_bar > max_pixels:
        beta = math.sqrt((frames * height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif bound_frames * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


class QwenVLProcessor(ItemProcessor):
    family = "qwen_vl"
    title = "Qwen-VL"
    options = QwenVLOptions
    placeholder_text = "<|vision_start|><|image_pad|><|vision_end|>"
    # What a family on the same patches changes (GLM-4.xV, glm4v.py): the token each image
    # embedding takes when the config does not name it, the image processor's own default
    # pixel bounds, and `target_size`.
    image_token: ClassVar[str] = "<|image_pad|>"
    default_pixels: ClassVar[tuple[int, int]] = (56 * 56, 28 * 28 * 1280)

    def __init__(self, settings: QwenVLSettings, backend: str = DEFAULT_BACKEND) -> None:
        """`backend`: "native" resizes and lays out patches in one C pass, "numpy" in numpy."""
        if backend not in BACKENDS:
            raise ValueError(f"backend {backend!r} is not available; have {BACKENDS}")
        self.settings = settings
        self.backend = backend
        self._mean, self._std = fused_normalization(
            settings.mean, settings.std, settings.rescale_factor
        )
        self.defaults = QwenVLResize(settings.min_pixels, settings.max_pixels)

    @classmethod
    def matches(cls, files: ModelConfigs) -> bool:
        return files.config.get("model_type") in MODEL_TYPES

    @classmethod
    def from_files(cls, files: ModelConfigs) -> QwenVLProcessor:
        pre, size = files.preprocessor, files.preprocessor.get("size") or {}
        token = files.config.get("image_token_id")
        if token is None:
            token = files.vocab[cls.image_token]
        least, most = cls.default_pixels
        return cls(
            QwenVLSettings(
                patch_size=int(pre.get("patch_size", 14)),
                merge_size=int(pre.get("merge_size", 2)),
                temporal_patch_size=int(pre.get("temporal_patch_size", 2)),
                min_pixels=int(size.get("shortest_edge") or pre.get("min_pixels", least)),
                max_pixels=int(size.get("longest_edge") or pre.get("max_pixels", most)),
                mean=tuple(pre.get("image_mean", CLIP_MEAN)),
                std=tuple(pre.get("image_std", CLIP_STD)),
                rescale_factor=float(pre.get("rescale_factor", 1 / 255)),
                image_token_id=int(token),
            )
        )

    @property
    def anchor_token_id(self) -> int:
        return self.settings.image_token_id

    def settings_for(self, options: QwenVLOptions) -> QwenVLResize:
        size, defaults = options.size or QwenVLSize(), self.defaults
        resize = QwenVLResize(
            min_pixels=first_set(options.min_pixels, size.shortest_edge, defaults.min_pixels),
            max_pixels=first_set(options.max_pixels, size.longest_edge, defaults.max_pixels),
        )
        if resize.min_pixels > resize.max_pixels:
            raise OptionError("mm_processor_kwargs.min_pixels exceeds max_pixels")
        return resize

    def process(
        self, images: Sequence[np.ndarray], settings: QwenVLResize, raw_pixels: bool
    ) -> ProcessedItems:
        patches, grids = [], []
        for image in images:
            patch_rows, grid = self._one(image, settings, raw_pixels)
            patches.append(patch_rows)
            grids.append(grid)
        grid_thw = np.asarray(grids, dtype=np.int64).reshape(len(images), 3)
        merge = self.settings.merge_size**2
        token = self.settings.image_token_id
        # math.prod on the grids' ints: the same numbers as numpy's prod, without its overhead
        sizes = [math.prod(g) for g in grids]
        return ProcessedItems(
            tensors={
                "pixel_values": np.concatenate(patches) if len(patches) > 1 else patches[0],
                "image_grid_thw": grid_thw,
                SIZES_KEY: np.asarray(sizes, dtype=np.int64),
            },
            batched_keys=("image_grid_thw", SIZES_KEY),
            flat_keys={"pixel_values": SIZES_KEY},
            # As vLLM's field config has it: the grid stays on the CPU, and is what the engine
            # keeps of an item whose placeholders are all prefix-cached (M-RoPE positions
            # need it; vLLM's strip_covered_mm_data drops every other field).
            keep_on_cpu_keys=("image_grid_thw",),
            replacements=[[token] * (size // merge) for size in sizes],
        )

    def target_size(self, height: int, width: int, bounds: QwenVLResize) -> tuple[int, int]:
        """The size an image of height x width is resized to, within `bounds`."""
        factor = self.settings.patch_size * self.settings.merge_size
        return smart_resize(height, width, factor, bounds.min_pixels, bounds.max_pixels)

    def _one(
        self, image: np.ndarray, resize_within: QwenVLResize, raw_pixels: bool
    ) -> tuple[np.ndarray, tuple[int, int, int]]:
        s = self.settings
        height, width = self.target_size(image.shape[0], image.shape[1], resize_within)
        if self.backend == "native" and image.ndim == 3 and image.shape[2] == 3:
            normalize = None if raw_pixels else (self._mean, self._std)
            p, m, t = s.patch_size, s.merge_size, s.temporal_patch_size
            patches = native.qwen_patches(image, height, width, p, m, t, normalize)
        else:
            pixels = resize(image, height, width, "bicubic", backend=self.backend)
            patches = self._patchify(pixels, raw_pixels)
        return patches, (1, height // s.patch_size, width // s.patch_size)

    def _patchify(self, pixels: np.ndarray, raw_pixels: bool) -> np.ndarray:
        """HWC uint8 to one row per patch, normalized unless `raw_pixels`."""
        s = self.settings
        p, m, t = s.patch_size, s.merge_size, s.temporal_patch_size
        h, w, c = pixels.shape
        gh, gw = h // p, w // p
        # (gh/m, m, p, gw/m, m, p, c) -> (gh/m, gw/m, m, m, c, p, p): merge groups stay adjacent.
        blocks = pixels.reshape(gh // m, m, p, gw // m, m, p, c).transpose(0, 3, 1, 4, 6, 2, 5)
        shape = (gh // m, gw // m, m, m, c, t, p, p)
        if raw_pixels:
            # One still image fills every temporal slot: gather into the first, copy the rest.
            out = np.empty(shape, np.uint8)
            out[:, :, :, :, :, 0] = blocks
            out[:, :, :, :, :, 1:] = out[:, :, :, :, :, :1]
        else:
            # Gather the uint8 pixels first (4x fewer bytes to shuffle), then normalize straight
            # into the output, broadcasting over the temporal slots: the same float32
            # (x - mean/r) / (std/r) per element as before, with long contiguous inner loops.
            single = np.empty((*shape[:5], 1, p, p), np.uint8)
            single[:, :, :, :, :, 0] = blocks
            out = np.empty(shape, np.float32)
            np.subtract(single, self._mean.reshape(c, 1, 1, 1), out=out, dtype=np.float32)
            np.divide(out, self._std.reshape(c, 1, 1, 1), out=out)
        return out.reshape(gh * gw, c * t * p * p)
