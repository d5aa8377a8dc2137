"""Qwen2-VL, Qwen2.5-VL and Qwen3-VL images: smart resize, temporal duplication, patch grids.

Mirrors transformers' Qwen2VLImageProcessor (torchvision backend, which vLLM runs): resize to
multiples of patch*merge within [min_pixels, max_pixels], bicubic; optional rescale+normalize;
each patch flattened as (channel, temporal copy, row, column); `<|image_pad|>` repeated
t*h*w / merge^2 times per image. Qwen3-VL differs only in its numbers (patch 16, mean/std 0.5),
which come from the model's preprocessor config.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from multimodal import native
from multimodal.processors.base import (
    ImageProcessor,
    ModelFiles,
    OptionError,
    ProcessedImages,
)
from multimodal.resize import BACKENDS, DEFAULT_BACKEND, resize

MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe")
SIZES_KEY = "patches_per_image"
MAX_ASPECT_RATIO = 200
OPTION_KEYS = ("min_pixels", "max_pixels")


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


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int):
    """transformers' smart_resize, to the operation (Python's round() is banker's rounding)."""
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise OptionError(
            f"image aspect ratio {max(height, width) / min(height, width):.0f} exceeds "
            f"{MAX_ASPECT_RATIO}"
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


class QwenVLProcessor(ImageProcessor):
    family = "qwen_vl"
    placeholder_text = "<|vision_start|><|image_pad|><|vision_end|>"

    def __init__(self, settings: QwenVLSettings, backend: str = DEFAULT_BACKEND) -> None:
        """`backend`: "native" resizes and lays out patches in one C pass, "numpy" in numpy."""
        if backend not in BACKENDS:
            raise ValueError(f"backend {backend!r} is not available; have {BACKENDS}")
        self.settings = settings
        self.backend = backend
        s = settings
        # Fused rescale+normalize as transformers does it: (x - mean/r) / (std/r) in float32.
        scale = np.float32(1.0 / s.rescale_factor)
        self._mean = np.asarray(s.mean, dtype=np.float32) * scale
        self._std = np.asarray(s.std, dtype=np.float32) * scale
        self._default_options: dict[str, Any] | None = None  # resolve_options({}), once

    @classmethod
    def matches(cls, files: ModelFiles) -> bool:
        return files.config.get("model_type") in MODEL_TYPES

    @classmethod
    def from_files(cls, files: ModelFiles) -> QwenVLProcessor:
        pre, size = files.preprocessor, files.preprocessor.get("size") or {}
        token = files.config.get("image_token_id")
        if token is None:
            token = files.vocab["<|image_pad|>"]
        return cls(
            QwenVLSettings(
                patch_size=int(pre.get("patch_size", 14)),
                merge_size=int(pre.get("merge_size", 2)),
                temporal_patch_size=int(pre.get("temporal_patch_size", 2)),
                min_pixels=int(size.get("shortest_edge") or pre.get("min_pixels", 56 * 56)),
                max_pixels=int(size.get("longest_edge") or pre.get("max_pixels", 28 * 28 * 1280)),
                mean=tuple(pre.get("image_mean", (0.48145466, 0.4578275, 0.40821073))),
                std=tuple(pre.get("image_std", (0.26862954, 0.26130258, 0.27577711))),
                rescale_factor=float(pre.get("rescale_factor", 1 / 255)),
                image_token_id=int(token),
            )
        )

    @property
    def anchor_token_id(self) -> int:
        return self.settings.image_token_id

    def resolve_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        if not options:  # the common case, resolved once (a few us a request)
            if self._default_options is None:
                self._default_options = self._resolve_options(options)
            return dict(self._default_options)
        return self._resolve_options(options)

    def _resolve_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        unknown = set(options) - set(OPTION_KEYS) - {"size"}
        if unknown:
            raise OptionError(
                f"unsupported mm_processor_kwargs {sorted(unknown)} for Qwen-VL "
                f"(accepted: {', '.join(OPTION_KEYS)}, size)"
            )
        size = options.get("size") or {}
        if not isinstance(size, Mapping):
            raise OptionError("mm_processor_kwargs.size must be an object")
        resolved = {
            "min_pixels": options.get("min_pixels", size.get("shortest_edge"))
            or self.settings.min_pixels,
            "max_pixels": options.get("max_pixels", size.get("longest_edge"))
            or self.settings.max_pixels,
        }
        for key, value in resolved.items():
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise OptionError(f"mm_processor_kwargs.{key} must be a positive integer")
        if resolved["min_pixels"] > resolved["max_pixels"]:
            raise OptionError("mm_processor_kwargs.min_pixels exceeds max_pixels")
        return resolved

    def process(
        self, images: Sequence[np.ndarray], options: Mapping[str, Any], raw_pixels: bool
    ) -> ProcessedImages:
        opts = self.resolve_options(options)
        patches, grids = [], []
        for image in images:
            patch_rows, grid = self._one(image, opts, raw_pixels)
            patches.append(patch_rows)
            grids.append(grid)
        grid_thw = np.asarray(grids, dtype=np.int64).reshape(len(images), 3)
        merge = self.settings.merge_size**2
        token = self.settings.image_token_id
        # math.prod on the grids' ints: the same numbers as numpy's prod, without its overhead
        sizes = [math.prod(g) for g in grids]
        return ProcessedImages(
            tensors={
                "pixel_values": np.concatenate(patches) if len(patches) > 1 else patches[0],
                "image_grid_thw": grid_thw,
                SIZES_KEY: np.asarray(sizes, dtype=np.int64),
            },
            batched_keys=("image_grid_thw", SIZES_KEY),
            flat_keys={"pixel_values": SIZES_KEY},
            replacements=[[token] * (size // merge) for size in sizes],
        )

    def _one(
        self, image: np.ndarray, opts: Mapping[str, Any], raw_pixels: bool
    ) -> tuple[np.ndarray, tuple[int, int, int]]:
        s = self.settings
        factor = s.patch_size * s.merge_size
        height, width = smart_resize(
            image.shape[0], image.shape[1], factor, opts["min_pixels"], opts["max_pixels"]
        )
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
