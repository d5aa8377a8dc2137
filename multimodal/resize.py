"""Resize uint8 images exactly as torchvision does on CPU (what HF image processors run).

HuggingFace image processors (transformers >= 5, torchvision backend) call
``torchvision.transforms.v2.functional.resize(uint8 CHW tensor, size, BICUBIC|BILINEAR|
LANCZOS, antialias=True)``.  On CPU torchvision keeps the uint8 tensor (no float round trip;
LANCZOS too, as torch's ``_upsample_lanczos2d_aa`` in torch 2.13 / torchvision 0.28): int16
fixed-point weights per axis (multimodal.resize_weights), ``clamp((sum(w * x) + 2**(p-1)) >> p,
0, 255)`` with an int32 accumulator, two passes, horizontal (width) first, the intermediate
image stored as uint8 (rounded and clamped), so the order matters.  An axis whose size does not
change is skipped, and an unchanged size overall returns the input.

Two backends compute the same bytes: the native kernels (multimodal.native, C with AVX2 or
AVX-512) when they are built, else numpy matrix products (multimodal.resize_numpy).  The result
is bit-identical to torchvision for 1-4 channels (checked for all by
tests/unit/multimodal/test_resize.py).

Pillow uses the same filters but 22-bit int32 weights on every axis (1-2 grey levels off on
<1% of pixels), and Pillow 13 runs the vertical pass first for e.g. 640x480 -> 644x476, so
the intermediate clamping differs there by up to 22 levels on noisy images.
Known torch quirks that are *not* reproduced: for a contiguous 3-channel tensor, a 1x1 output
needing a vertical pass trips an internal assert in torch; with more than 4 channels torch's
generic kernel duplicates rows when the output width is 1; on x86 without AVX2, torchvision
resizes bilinear images in float32 instead.
"""

from __future__ import annotations

import numpy as np

from multimodal import native
from multimodal.resize_numpy import resize_numpy
from multimodal.resize_weights import METHODS, AxisWeights, axis_weights

__all__ = ["BACKENDS", "DEFAULT_BACKEND", "AxisWeights", "Crop", "axis_weights", "resize"]

BACKENDS = ("native", "numpy") if native.AVAILABLE else ("numpy",)
DEFAULT_BACKEND = BACKENDS[0]


# A window of the resized image: top, left, height, width.
Crop = tuple[int, int, int, int]


def resize(
    image: np.ndarray,
    height: int,
    width: int,
    method: str = "bicubic",
    backend: str = DEFAULT_BACKEND,
    crop: Crop | None = None,
) -> np.ndarray:
    """Resize an HxWxC (or HxW) uint8 image exactly like torchvision does on CPU.

    Equivalent to ``torchvision.transforms.v2.functional.resize(torch.from_numpy(image)
    .permute(2, 0, 1), [height, width], interpolation, antialias=True)`` transposed back to
    HxWxC; ``method`` is "bicubic", "bilinear" or "lanczos"; ``backend`` one of ``BACKENDS``.

    With ``crop``, only that window of the resized image: the same pixels as slicing the whole
    result, but the native kernels compute no pixel outside it (each output pixel depends on its
    own weights alone). When the size does not change, the window is a view of the input.
    """
    _check(image, height, width, method, backend)
    if crop is not None:
        return _resize_window(image, height, width, method, backend, crop)
    if image.ndim == 2:
        return resize(image[:, :, None], height, width, method, backend)[:, :, 0]
    if image.shape[:2] == (height, width):
        return image.copy()
    if backend == "native":
        return native.resize(image, height, width, method)
    return resize_numpy(image, height, width, method)


def _check(image: np.ndarray, height: int, width: int, method: str, backend: str) -> None:
    if method not in METHODS:
        raise ValueError(f"unsupported resize method {method!r}; use one of {list(METHODS)}")
    if backend not in BACKENDS:
        raise ValueError(f"resize backend {backend!r} is not available; have {BACKENDS}")
    if image.dtype != np.uint8 or image.ndim not in (2, 3):
        raise ValueError(f"expected an HxW or HxWxC uint8 array, got {image.dtype} {image.shape}")
    if height < 1 or width < 1 or 0 in image.shape:
        raise ValueError(f"cannot resize {image.shape[:2]} to {(height, width)}")


def _resize_window(
    image: np.ndarray, height: int, width: int, method: str, backend: str, crop: Crop
) -> np.ndarray:
    top, left, crop_h, crop_w = crop
    inside = 0 <= top <= height - crop_h and 0 <= left <= width - crop_w
    if not (crop_h > 0 and crop_w > 0 and inside):
        raise ValueError(f"crop {crop} is not inside {(height, width)}")
    if image.ndim == 3 and image.shape[:2] == (height, width):
        return image[top : top + crop_h, left : left + crop_w]
    if backend != "native" or image.ndim != 3:
        return resize(image, height, width, method, backend)[
            top : top + crop_h, left : left + crop_w
        ]
    return native.resize(image, height, width, method, crop)
