"""torchvision's fixed-point resampling weights, shared by both resize backends.

torchvision's CPU resize of uint8 images (``torch._upsample_{bicubic,bilinear,lanczos}2d_aa``,
kernel ``aten/src/ATen/native/cpu/UpSampleKernelAVXAntialias.h``, a port of Pillow-SIMD; the
NEON and generic fallbacks compute the same thing) derives, per output index ``i`` of one axis,
in float64, exactly as Pillow does:

* ``scale = in/out``, ``support = taps/2 * max(scale, 1)`` (taps = 4 for bicubic, 2 for
  bilinear, 6 for lanczos), ``center = scale * (i + 0.5)``, first input
  ``xmin = max(int(center - support + 0.5), 0)``, count
  ``min(int(center + support + 0.5), in) - xmin``, weight of input ``x``
  = ``filter((x - center + 0.5) / max(scale, 1))`` normalised to sum 1.  The bicubic filter
  is Keys' cubic with ``a = -0.5`` for *every* scale factor: with antialias=True upscaling
  uses this same kernel (not the ``a = -0.75`` of the antialias=False path); bilinear is
  the triangle filter; lanczos is Lanczos-3, ``sinc(x) * sinc(x / 3)`` (ATen's
  HelperInterpLanczos, Pillow's filter, ``sinc(x) = sin(pi x) / (pi x)`` in float64; numpy's
  sin gives libm's values here, which tests/unit/multimodal/test_resize.py checks through
  the pixels).
* Fixed point: the weights of an axis are scaled by ``2**p`` and rounded half away from
  zero to int16, where ``p`` (at most 22) is the largest precision keeping the largest
  weight of the whole axis below ``2**15``.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np

_CUBIC_A = -0.5  # ATen's HelperInterpCubic::aa_filter (antialias=True), as Pillow


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


def _sinc(x: np.ndarray) -> np.ndarray:
    # ATen's HelperInterpLanczos::sinc_filter (Pillow's): sin(x * pi) / (x * pi), 1 at 0.
    x = x * math.pi
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(x == 0.0, 1.0, np.sin(x) / x)


def _lanczos(x: np.ndarray) -> np.ndarray:
    # ATen's HelperInterpLanczos::aa_filter: Lanczos-3, sinc(x) * sinc(x / 3) for |x| < 3.
    x = np.abs(x)
    return np.where(x < 3.0, _sinc(x) * _sinc(x / 3.0), 0.0)


# method -> (filter support at scale 1, i.e. taps when upscaling, filter)
_FILTERS = {"bicubic": (4, _cubic), "bilinear": (2, _triangle), "lanczos": (6, _lanczos)}
METHODS = tuple(sorted(_FILTERS))


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
