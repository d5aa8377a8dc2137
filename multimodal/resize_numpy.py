"""The numpy resize backend: torchvision's integer arithmetic through BLAS matrix products.

Used when the native kernels (multimodal._kernels) are not built.  The weights of
multimodal.resize_weights are applied with banded float matrix products, which is exact because
every product and partial sum is an integer the float type represents: inputs are shifted to
``x - 128`` so that float32 (24-bit mantissa) suffices whenever ``128 * sum(|w|) < 2**24``,
i.e. for upscales and downscales by up to ~4x; stronger downscales use float64.  Each pass then
rounds like torch: ``clamp((sum(w * x) + 2**(p-1)) >> p, 0, 255)``, width pass first, the
intermediate image rounded to uint8 values.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from multimodal.resize_weights import axis_weights

_OFFSET = 128  # inputs are fed to BLAS as x - 128 to halve the magnitude of partial sums
_F32_LIMIT = 1 << 24  # integers up to this magnitude are exact in float32
_CHUNK_BYTES = 3 << 20  # float rows converted per horizontal chunk: stays in L2/L3 cache


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


def resize_numpy(image: np.ndarray, height: int, width: int, method: str) -> np.ndarray:
    """An HxWxC uint8 image of another size resized to height x width, as torchvision does."""
    h_in, w_in, channels = image.shape
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
