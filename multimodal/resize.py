"""Bit-exact NumPy port of torchvision's CPU resize of uint8 images (bicubic / bilinear).

HuggingFace image processors (transformers >= 5, torchvision backend) call
``torchvision.transforms.v2.functional.resize(uint8 CHW tensor, size, BICUBIC|BILINEAR,
antialias=True)``.  On CPU torchvision keeps the uint8 tensor (no float round trip) and
calls ``torch._upsample_{bicubic,bilinear}2d_aa``, whose uint8 kernel
(``aten/src/ATen/native/cpu/UpSampleKernelAVXAntialias.h``, a port of Pillow-SIMD; the NEON
and generic fallbacks compute the same thing) does:

* Weights per output index ``i`` of one axis, in float64, exactly as Pillow does:
  ``scale = in/out``, ``support = taps/2 * max(scale, 1)`` (taps = 4 for bicubic, 2 for
  bilinear), ``center = scale * (i + 0.5)``, first input ``xmin = max(int(center - support
  + 0.5), 0)``, count ``min(int(center + support + 0.5), in) - xmin``, weight of input ``x``
  = ``filter((x - center + 0.5) / max(scale, 1))`` normalised to sum 1.  The bicubic filter
  is Keys' cubic with ``a = -0.5`` for *every* scale factor: with antialias=True upscaling
  uses this same kernel (not the ``a = -0.75`` of the antialias=False path); bilinear is
  the triangle filter.
* Fixed point: the weights of an axis are scaled by ``2**p`` and rounded half away from
  zero to int16, where ``p`` (at most 22) is the largest precision keeping the largest
  weight of the whole axis below ``2**15``.
* Output = ``clamp((sum(w * x) + 2**(p-1)) >> p, 0, 255)`` with an int32 accumulator,
  i.e. round-half-up of the exact integer sum, then saturation to uint8.
* Two passes, horizontal (width) first; the intermediate image is stored as uint8
  (rounded and clamped), so the order matters.  An axis whose size does not change is
  skipped, and an unchanged size overall returns the input.

Pillow uses the same filters but 22-bit int32 weights on every axis (1-2 grey levels off on
<1% of pixels), and Pillow 13 runs the vertical pass first for e.g. 640x480 -> 644x476, so
the intermediate clamping differs there by up to 22 levels on noisy images.

Here the same integer weights are applied with banded float matrix products (BLAS), which is
exact because every product and partial sum is an integer the float type represents: inputs
are shifted to ``x - 128`` so that float32 (24-bit mantissa) suffices whenever
``128 * sum(|w|) < 2**24``, i.e. for upscales and downscales by up to ~4x; stronger
downscales use float64.
The result is bit-identical to torchvision for 1-4 channels (checked by tests/test_resize.py).
Known torch quirks that are *not* reproduced: for a contiguous 3-channel tensor, a 1x1 output
needing a vertical pass trips an internal assert in torch; with more than 4 channels torch's
generic kernel duplicates rows when the output width is 1; on x86 without AVX2, torchvision
resizes bilinear images in float32 instead.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np

_CUBIC_A = -0.5  # ATen's HelperInterpCubic::aa_filter (antialias=True), as Pillow
_OFFSET = 128  # inputs are fed to BLAS as x - 128 to halve the magnitude of partial sums
_F32_LIMIT = 1 << 24  # integers up to this magnitude are exact in float32
_CHUNK_BYTES = 3 << 20  # float rows converted per horizontal chunk: stays in L2/L3 cache


def _cubic(x: np.ndarray) -> np.ndarray:
    # Same operation order as ATen's cubic_convolution1/2 so float64 results are identical.
    a = _CUBIC_A
    x = np.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


def _triangle(x: np.ndarray) -> np.ndarray:
    x = np.abs(x)
    return np.where(x < 1.0, 1.0 - x, 0.0)


# method -> (filter support at scale 1, i.e. taps when upscaling, filter)
_FILTERS = {"bicubic": (4, _cubic), "bilinear": (2, _triangle)}


class AxisWeights(NamedTuple):
    """torch's fixed-point resampling weights for one axis."""

    starts: np.ndarray  # (n_out,) first input index of each output
    sizes: np.ndarray  # (n_out,) number of inputs of each output
    weights: np.ndarray  # (n_out, taps) int64, zero past `sizes`
    precision: int  # weights are scaled by 2**precision


@functools.lru_cache(maxsize=256)
def axis_weights(n_in: int, n_out: int, method: str) -> AxisWeights:
    """Integer weights as computed by ATen's ``_compute_index_ranges_int16_weights``."""
    taps, kernel = _FILTERS[method]
    scale = n_in / n_out
    support = taps * 0.5 * scale if scale >= 1.0 else taps * 0.5
    inv_scale = 1.0 / scale if scale >= 1.0 else 1.0
    max_taps = math.ceil(support) * 2 + 1

    center = scale * (np.arange(n_out) + 0.5)
    # C++ casts to int64 truncate toward zero.
    starts = np.maximum(np.trunc(center - support + 0.5).astype(np.int64), 0)
    ends = np.minimum(np.trunc(center + support + 0.5).astype(np.int64), n_in)
    sizes = np.clip(ends - starts, 0, max_taps)

    k = np.arange(max_taps)
    x = ((k + starts[:, None]) - center[:, None] + 0.5) * inv_scale
    w = np.where(k < sizes[:, None], kernel(x), 0.0)
    total = np.zeros(n_out)
    for j in range(max_taps):  # sequential sum, like the C++ loop (np.sum is pairwise)
        total = total + w[:, j]
    w = np.divide(w, total[:, None], out=w, where=total[:, None] != 0.0)

    # Largest precision keeping the largest weight below 2**15 (int16), capped at 22.
    w_max = float(w.max())
    precision = 0
    while precision < 22 and int(0.5 + w_max * (1 << (precision + 1))) < (1 << 15):
        precision += 1
    scaled = w * (1 << precision)
    weights = np.trunc(scaled + np.where(scaled < 0, -0.5, 0.5)).astype(np.int64)
    return AxisWeights(starts, sizes, weights, precision)


class _Pass(NamedTuple):
    """One axis as dense weight blocks: out[o0:o1] = block @ in[lo:hi]."""

    blocks: tuple[tuple[int, int, int, int, np.ndarray], ...]
    bias: np.ndarray  # (n_out,) added to the block products before flooring, see _pass
    precision: int
    float32_exact: bool


@functools.lru_cache(maxsize=256)
def _pass(n_in: int, n_out: int, method: str, dtype: str, block: int) -> _Pass:
    aw = axis_weights(n_in, n_out, method)
    p = aw.precision
    step = 2.0**-p  # folded into the weights: exact, it is a power of two
    blocks = []
    for o0 in range(0, n_out, block):
        o1 = min(o0 + block, n_out)
        lo = int(aw.starts[o0:o1].min())
        hi = int((aw.starts[o0:o1] + aw.sizes[o0:o1]).max())
        mat = np.zeros((o1 - o0, hi - lo), dtype)
        for o in range(o0, o1):
            s, n = int(aw.starts[o]) - lo, int(aw.sizes[o])
            mat[o - o0, s : s + n] = aw.weights[o, :n] * step
        mat.setflags(write=False)
        blocks.append((o0, o1, lo, hi, mat))

    # With inputs x - 128 the block products give r = (sum(w*x) - 128*sum(w)) / 2**p, and
    # floor(r + bias) = ((sum(w*x) + 2**(p-1)) >> p) - 128: torch's result, still offset.
    sums = aw.weights.sum(axis=1)
    bias = ((_OFFSET * (sums - (1 << p)) + (1 << (p - 1))) * step).astype(dtype)
    bias.setflags(write=False)

    # float32 is exact if every partial sum (and the biased result) stays below 2**24; past
    # 2**24 / 2**p (>= 256 when p <= 16) the result saturates anyway.
    worst = _OFFSET * np.abs(aw.weights).sum(axis=1).max()
    worst += _OFFSET * np.abs(sums - (1 << p)).max() + (1 << (p - 1))
    float32_exact = bool(worst < _F32_LIMIT and p <= 16)
    return _Pass(tuple(blocks), bias, p, float32_exact)


def _block_size(n_in: int, n_out: int, horizontal: bool) -> int:
    # Each block is a dense (block x window) matrix, window ~ block * scale + taps: small
    # blocks waste fewer multiplications, large ones keep BLAS efficient.  Measured on
    # single-threaded OpenBLAS (benchmarks/resize_bench.py sizes plus 2x, 5x and upscales).
    scale = n_in / n_out
    if not horizontal:
        return 4 if scale >= 1.0 else 8
    return 32 if scale < 1.5 else 16 if scale < 4.0 else 8


def _horizontal(image: np.ndarray, width: int, method: str, dtype: str) -> np.ndarray:
    """Width pass of an HxWxC uint8 image -> (H, C, width) floats, offset by -128, rounded."""
    height, w_in, channels = image.shape
    plan = _pass(w_in, width, method, dtype, _block_size(w_in, width, True))
    out = np.empty((height, channels, width), dtype)
    # Rows are converted in chunks so the float copy stays in cache and its buffer is reused
    # (a whole 4K image as floats is 100 MB of fresh pages to fault in on every call).
    rows = max(1, min(height, _CHUNK_BYTES // (channels * w_in * np.dtype(dtype).itemsize)))
    chunk = np.empty((rows, channels, w_in), dtype)
    for r0 in range(0, height, rows):
        r1 = min(r0 + rows, height)
        src = chunk[: r1 - r0]
        np.subtract(image[r0:r1].transpose(0, 2, 1), _OFFSET, out=src, dtype=dtype)
        src = src.reshape(-1, w_in)
        dst = out[r0:r1].reshape(-1, width)
        for o0, o1, lo, hi, mat in plan.blocks:
            np.matmul(src[:, lo:hi], mat.T, out=dst[:, o0:o1])
        _round_offset(dst, plan.bias)
    return out


def _round_offset(values: np.ndarray, bias: np.ndarray) -> None:
    """In place: torch's rounded, saturated uint8 value minus 128."""
    values += bias
    np.floor(values, out=values)
    np.clip(values, -_OFFSET, 255 - _OFFSET, out=values)


def _vertical(planes: np.ndarray, height: int, method: str, dtype: str) -> np.ndarray:
    """Height pass of (H, C, W) offset floats -> (height, C, W) unrounded block products."""
    h_in, channels, width = planes.shape
    plan = _pass(h_in, height, method, dtype, _block_size(h_in, height, False))
    src = planes.reshape(h_in, channels * width)
    out = np.empty((height, channels * width), dtype)
    for o0, o1, lo, hi, mat in plan.blocks:
        np.matmul(mat, src[lo:hi], out=out[o0:o1])
    out += plan.bias[:, None] + _OFFSET  # + 128 undoes the input offset
    return out.reshape(height, channels, width)


def _use_float32(shape: tuple[int, int], size: tuple[int, int], method: str) -> bool:
    return all(
        _pass(n_in, n_out, method, "float32", _block_size(n_in, n_out, axis == 1)).float32_exact
        for axis, (n_in, n_out) in enumerate(zip(shape, size))
        if n_in != n_out
    )


def resize(image: np.ndarray, height: int, width: int, method: str = "bicubic") -> np.ndarray:
    """Resize an HxWxC (or HxW) uint8 image exactly like torchvision does on CPU.

    Equivalent to ``torchvision.transforms.v2.functional.resize(torch.from_numpy(image)
    .permute(2, 0, 1), [height, width], interpolation, antialias=True)`` transposed back to
    HxWxC; ``method`` is "bicubic" or "bilinear".
    """
    if method not in _FILTERS:
        raise ValueError(f"unsupported resize method {method!r}; use one of {sorted(_FILTERS)}")
    if image.dtype != np.uint8 or image.ndim not in (2, 3):
        raise ValueError(f"expected an HxW or HxWxC uint8 array, got {image.dtype} {image.shape}")
    if height < 1 or width < 1 or 0 in image.shape:
        raise ValueError(f"cannot resize {image.shape[:2]} to {(height, width)}")
    if image.ndim == 2:
        return resize(image[:, :, None], height, width, method)[:, :, 0]

    h_in, w_in, channels = image.shape
    if (h_in, w_in) == (height, width):
        return image.copy()
    dtype = "float32" if _use_float32((h_in, w_in), (height, width), method) else "float64"

    if width != w_in:
        planes = _horizontal(image, width, method, dtype)
    else:
        planes = np.empty((h_in, channels, w_in), dtype)
        np.subtract(image.transpose(0, 2, 1), _OFFSET, out=planes, dtype=dtype)
    if height != h_in:
        planes = _vertical(planes, height, method, dtype)
    else:
        planes += _OFFSET  # already rounded by the width pass

    # Clamp, then truncate: equals floor on [0, 255], i.e. torch's shift and saturation.
    np.clip(planes, 0, 255, out=planes)
    return planes.transpose(0, 2, 1).astype(np.uint8)
