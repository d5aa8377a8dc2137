"""Image steps shared by the families, each bit-identical to transformers' torchvision backend
(what vLLM runs), as transformers' `image_transforms.py` and SMG's `transforms.rs` share them.

All work on HxWxC uint8 arrays; a family file composes them and holds only what differs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from multimodal import native
from multimodal.processors.base import ModelConfigError
from multimodal.resize import resize

# OpenAI CLIP's normalization, transformers' OPENAI_CLIP_MEAN / OPENAI_CLIP_STD: the defaults
# of CLIP-like and Qwen-VL image processors.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
# PIL resample codes transformers stores in preprocessor configs.
RESAMPLE = {2: "bilinear", 3: "bicubic"}


def channel_triple(values: Any) -> tuple[float, float, float]:
    """A config's image_mean / image_std: one value for all channels, or three."""
    if isinstance(values, (int, float)):
        return (float(values),) * 3
    values = tuple(float(v) for v in values)
    if len(values) != 3:
        raise ModelConfigError(f"expected 3 channel values, got {values}")
    return values


def fused_normalization(
    mean: Sequence[float], std: Sequence[float], rescale_factor: float
) -> tuple[np.ndarray, np.ndarray]:
    """Rescale and normalize fused as transformers does it: (x - mean/r) / (std/r) in float32,
    on uint8 x. Returns (mean/r, std/r) per channel."""
    scale = np.float32(1.0 / rescale_factor)
    return np.asarray(mean, dtype=np.float32) * scale, np.asarray(std, dtype=np.float32) * scale


def shortest_edge_size(height: int, width: int, size: int) -> tuple[int, int]:
    """transformers' get_resize_output_image_size(default_to_square=False): long edge int()."""
    short, long = (width, height) if width <= height else (height, width)
    new_long = int(size * long / short)
    return (new_long, size) if width <= height else (size, new_long)


def resize_to(image: np.ndarray, height: int, width: int, method: str) -> np.ndarray:
    # torchvision returns the input untouched when the size does not change.
    if image.shape[:2] == (height, width):
        return image
    return resize(image, height, width, method)


def pad(image: np.ndarray, left: int, top: int, right: int, bottom: int, fill=0) -> np.ndarray:
    """tvF.pad with a constant (scalar or per-channel) fill, HWC."""
    h, w, c = image.shape
    out = np.empty((h + top + bottom, w + left + right, c), dtype=image.dtype)
    fill = np.asarray(fill, dtype=image.dtype)
    # Fill only the border strips; the image is copied over the rest.
    out[:top] = fill
    out[top + h :] = fill
    out[top : top + h, :left] = fill
    out[top : top + h, left + w :] = fill
    out[top : top + h, left : left + w] = image
    return out


def center_crop(image: np.ndarray, crop_h: int, crop_w: int) -> np.ndarray:
    """TorchvisionBackend.center_crop: zero-pad when too small, then int((size - crop) / 2)."""
    h, w = image.shape[:2]
    if crop_w > w or crop_h > h:
        image = pad(
            image,
            (crop_w - w) // 2 if crop_w > w else 0,
            (crop_h - h) // 2 if crop_h > h else 0,
            (crop_w - w + 1) // 2 if crop_w > w else 0,
            (crop_h - h + 1) // 2 if crop_h > h else 0,
        )
        h, w = image.shape[:2]
        if (h, w) == (crop_h, crop_w):
            return image
    top = int((h - crop_h) / 2.0)
    left = int((w - crop_w) / 2.0)
    return image[top : top + crop_h, left : left + crop_w]


def channel_planes(image: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """HWC uint8 to CHW uint8, into `out` if given; else, without the native kernels, a
    transposed view."""
    if native.AVAILABLE and image.ndim == 3 and image.shape[2] == 3:
        return native.chw(image, out)
    if out is None:
        return image.transpose(2, 0, 1)
    out[...] = image.transpose(2, 0, 1)
    return out


def tiles_into(
    image: np.ndarray, height: int, width: int, method: str, out: np.ndarray
) -> np.ndarray:
    """The HxWx3 uint8 image resized to height x width (untouched if it has that size) at the
    top left of a zero canvas cut into out's (rows, cols, 3, T, T) tiles, row by row, as
    channel planes; returns `out`. The native kernels write the planes as they resize (no
    canvas, no transposing copy); without them numpy resizes, pads and transposes: the same
    bytes."""
    if native.AVAILABLE and image.ndim == 3 and image.shape[2] == 3:
        return native.tiles(image, height, width, method, out)
    resized = resize_to(image, height, width, method)
    rows, cols, channels, tile, _ = out.shape
    if (height, width) != (rows * tile, cols * tile):
        resized = pad(resized, 0, 0, cols * tile - width, rows * tile - height)
    out[...] = resized.reshape(rows, tile, cols, tile, channels).transpose(0, 2, 4, 1, 3)
    return out


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


def fit_within(height: int, width: int, target_h: int, target_w: int) -> tuple[int, int]:
    """transformers' get_patch_output_size: fit inside the target keeping aspect, ceil."""
    scale_w, scale_h = target_w / width, target_h / height
    if scale_w < scale_h:
        return min(math.ceil(height * scale_w), target_h), target_w
    return target_h, min(math.ceil(width * scale_h), target_w)


def resize_frames(frames: np.ndarray, height: int, width: int, method: str) -> np.ndarray:
    """(N, H, W, C) uint8 frames, each resized as one image: torchvision resizes a video
    tensor frame by frame (the filter is spatial only), so the bytes are the image path's."""
    if frames.shape[1:3] == (height, width):
        return frames
    out = np.empty((len(frames), height, width, frames.shape[3]), np.uint8)
    for k, frame in enumerate(frames):
        out[k] = resize(frame, height, width, method)
    return out


def temporal_patches(
    frames: np.ndarray,
    patch: int,
    merge: int,
    temporal: int,
    normalize: tuple[np.ndarray, np.ndarray] | None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """transformers' Qwen2-VL video `patchify` on resized (N, H, W, 3) uint8 frames: a count
    not divisible by `temporal` padded by repeating the last frame; one row per
    (t, h, w) patch, merge groups adjacent, each row (channel, temporal, row, column).
    uint8 rows if `normalize` is None, else float32 (x - mean) / std with (mean, std) from
    `fused_normalization` (transformers normalizes before the layout; per element the same).
    Written into `out` (rows x columns, of that dtype) when given."""
    if pad_count := -len(frames) % temporal:
        frames = np.concatenate([frames, np.repeat(frames[-1:], pad_count, axis=0)])
    n, h, w, c = frames.shape
    gt, gh, gw = n // temporal, h // patch, w // patch
    blocks = frames.reshape(gt, temporal, gh // merge, merge, patch, gw // merge, merge, patch, c)
    # -> (gt, gh/m, gw/m, m, m, c, temporal, p, p)
    blocks = blocks.transpose(0, 2, 5, 3, 6, 8, 1, 4, 7)
    shape = (gt * gh * gw, c * temporal * patch * patch)
    if out is None:
        out = np.empty(shape, np.uint8 if normalize is None else np.float32)
    laid_out = out.reshape(blocks.shape)
    if normalize is None:
        np.copyto(laid_out, blocks)
        return out
    mean, std = normalize
    np.subtract(blocks, mean.reshape(c, 1, 1, 1), out=laid_out, dtype=np.float32)
    np.divide(laid_out, std.reshape(c, 1, 1, 1), out=laid_out)
    return out


def video_patches(
    frames: np.ndarray,
    height: int,
    width: int,
    patch: int,
    merge: int,
    temporal: int,
    normalize: tuple[np.ndarray, np.ndarray] | None,
) -> np.ndarray:
    """`resize_frames` (bicubic) then `temporal_patches`, one temporal patch of frames at a
    time: the resized clip is never whole in memory (144 MB for two minutes of 480p at 2
    fps), and the output comes from the native pool (a clip's patches are tens to hundreds of
    MB, which fresh pages would make the kernel zero on every request)."""
    groups = -(-len(frames) // temporal)
    rows = (height // patch) * (width // patch)
    dtype = np.uint8 if normalize is None else np.float32
    out = native.OUTPUTS.empty((groups * rows, 3 * temporal * patch * patch), dtype)
    last = len(frames) - 1
    for g in range(groups):
        # an odd count's last group repeats the last frame, as transformers pads
        picked = frames[[min(g * temporal + k, last) for k in range(temporal)]]
        resized = resize_frames(picked, height, width, "bicubic")
        temporal_patches(resized, patch, merge, temporal, normalize, out[g * rows : (g + 1) * rows])
    return out
