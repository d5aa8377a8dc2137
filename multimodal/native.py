"""The native kernels, multimodal._kernels (C, built from multimodal/_native/ by setup.py).

They compute exactly what the numpy code computes (torchvision's integer resize; the Qwen-VL
patch layout and float32 normalization of multimodal/processors/qwen_vl.py) in one pass over
the pixels, using AVX-512 or AVX2 where the CPU has them, and release the GIL while they work.  The
extension is optional: without it, ``AVAILABLE`` is False and callers use the numpy code.
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
import threading
from collections.abc import Iterator

import numpy as np

from multimodal.resize_weights import axis_weights

try:
    from multimodal import _kernels
except ImportError:  # not built (no C compiler at install time)
    _kernels = None

AVAILABLE = _kernels is not None
# An extension built before `normalize` existed (a stale in-place build) lacks it: its callers
# then take the numpy path, which gives the same floats.
HAS_NORMALIZE = AVAILABLE and hasattr(_kernels, "normalize")

# (starts int32, sizes int32, weights int16 [n_out, stride], stride, precision), or None for an
# axis that keeps its size: the argument layout of _kernels.
AxisArgument = tuple[np.ndarray, np.ndarray, np.ndarray, int, int]


# The kernel levels, each using the ones below where it has nothing of its own.
LEVELS = ("generic", "avx2", "avx512")


def simd_level() -> str | None:
    """The kernels in use on this CPU, "avx512", "avx2" or "generic"; None if not built."""
    return _kernels.kernels() if _kernels is not None else None


def level_supported(level: str) -> bool:
    """Whether this CPU can run the kernels of `level` (one of LEVELS)."""
    if _kernels is None:
        return False
    try:
        with kernels(level):
            return True
    except ValueError:
        return False


@contextlib.contextmanager
def kernels(level: str) -> Iterator[None]:
    """Inside, only the kernels up to `level` run (tests; not thread-safe).

    Raises ValueError when the CPU cannot run `level`.
    """
    previous = simd_level()
    _kernels.use_kernels(level)
    try:
        yield
    finally:
        _kernels.use_kernels(previous)


@functools.lru_cache(maxsize=256)
def axis_argument(n_in: int, n_out: int, method: str) -> AxisArgument | None:
    """One axis's weights (multimodal.resize_weights) laid out as _kernels takes them."""
    if n_in == n_out:
        return None
    aw = axis_weights(n_in, n_out, method)
    taps = aw.weights.shape[1]
    stride = taps + taps % 2  # even: the kernels read weights in pairs
    weights = np.zeros((n_out, stride), np.int16)
    weights[:, :taps] = aw.weights
    arrays = (aw.starts.astype(np.int32), aw.sizes.astype(np.int32), weights)
    for array in arrays:
        array.setflags(write=False)
    return (*arrays, stride, aw.precision)


def resize(
    image: np.ndarray,
    height: int,
    width: int,
    method: str,
    crop: tuple[int, int, int, int] | None = None,
) -> np.ndarray:
    """An HxWxC uint8 image resized to height x width, as torchvision does; with `crop` (top,
    left, height, width), only that window of it."""
    image, width_axis, height_axis, (out_h, out_w) = _resize_arguments(
        image, height, width, method, crop
    )
    h_in, w_in, channels = image.shape
    out = np.empty((out_h, out_w, channels), np.uint8)
    _kernels.resize(
        image, h_in, w_in, channels, out, out_h, out_w, width_axis, height_axis
    )  # fmt: skip
    return out


def tiles(
    image: np.ndarray,
    height: int,
    width: int,
    method: str,
    out: np.ndarray,
    top: int = 0,
    left: int = 0,
    crop: tuple[int, int, int, int] | None = None,
) -> np.ndarray:
    """An HxWx3 uint8 image resized as `resize` does, laid on a canvas of tiles, into `out`.

    `out` is (rows, cols, 3, T, T) uint8, C-contiguous: a canvas of rows x cols tiles of T x T
    pixels, each tile as 3 channel planes. The resized image (or its `crop` window) lies at
    (top, left) of the canvas, and every other canvas pixel is 0: LLaVA-NeXT's zero-padded
    anyres grid, cut into tiles, and its base tile. Returns `out`.
    """
    image, width_axis, height_axis, (out_h, out_w) = _resize_arguments(
        image, height, width, method, crop
    )
    rows, cols, channels, tile, tile_w = out.shape
    if channels != 3 or tile != tile_w or not out.flags.c_contiguous:
        raise ValueError(f"expected (rows, cols, 3, T, T) C-contiguous tiles, got {out.shape}")
    h_in, w_in, _ = image.shape
    _kernels.tiles(
        image, h_in, w_in, out, out_h, out_w, width_axis, height_axis,
        tile, rows, cols, top, left,
    )  # fmt: skip
    return out


def _resize_arguments(
    image: np.ndarray, height: int, width: int, method: str, crop: tuple[int, int, int, int] | None
) -> tuple[np.ndarray, AxisArgument | None, AxisArgument | None, tuple[int, int]]:
    """What the kernels take for a resize (of the `crop` window): the contiguous input, the
    width and height axes, the output size."""
    top, left, out_h, out_w = crop or (0, 0, height, width)
    h_in, w_in, _ = image.shape
    width_axis = _window(axis_argument(w_in, width, method), left, out_w)
    height_axis = _window(axis_argument(h_in, height, method), top, out_h)
    # An axis that keeps its size has no weights: its window is cut from the input instead.
    if h_in == height:
        image = image[top : top + out_h]
    if w_in == width:
        image = image[:, left : left + out_w]
    return np.ascontiguousarray(image), width_axis, height_axis, (out_h, out_w)


def _window(axis: AxisArgument | None, first: int, count: int) -> AxisArgument | None:
    """The weights of outputs first .. first + count - 1 of an axis."""
    if axis is None or (first == 0 and count == len(axis[0])):
        return axis
    starts, sizes, weights, stride, precision = axis
    end = first + count
    return starts[first:end], sizes[first:end], weights[first:end], stride, precision


def chw(image: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """An HxWx3 uint8 image as 3 channel planes (3xHxW), into `out` when given. The image may
    be a crop's view: rows any distance apart (downwards), as long as its pixels are packed."""
    if image.strides[1:] != (3, 1) or image.strides[0] < 3 * image.shape[1]:
        image = np.ascontiguousarray(image)
    if out is None:
        out = np.empty((3, *image.shape[:2]), np.uint8)
    _kernels.chw(image, out)
    return out


def normalize(planes: np.ndarray, mean_std: np.ndarray, out: np.ndarray) -> np.ndarray:
    """uint8 channel planes (..., 3, H, W), C-contiguous, to float32 (x - mean[c]) / std[c]
    into `out` (C-contiguous float32 of the same shape); `mean_std` is float32 means then
    stds. The same float32 operations as numpy's subtract then divide, in one pass."""
    if not (planes.flags.c_contiguous and out.flags.c_contiguous and planes.ndim >= 3):
        raise ValueError("expected C-contiguous (..., 3, H, W) planes and output")
    if planes.shape[-3] != 3 or out.shape != planes.shape or out.dtype != np.float32:
        raise ValueError(f"expected (..., 3, H, W) planes and a float32 output, got {out.shape}")
    plane = planes.shape[-2] * planes.shape[-1]
    _kernels.normalize(planes, planes.size // plane if plane else 0, plane, mean_std, out)
    return out


class OutputPool:
    """Big output arrays on memory that earlier outputs, since let go of, used.

    glibc's malloc keeps freed blocks for reuse only below 32 MiB (its mmap threshold cannot go
    higher); a bigger array gets fresh pages from the kernel, which zeroes each one on first
    touch: about 5 ms for the 50 MB of uint8 patches of a 3840x2160 image here, a third of the
    kernel's own time. So outputs of `least` bytes and more are carved from blocks kept here,
    at most `keep` of them and `most` bytes in all. A block is reused only when nothing
    references it but this pool: every array made from it (views, slices, reshapes) holds the
    block itself as its base, so its reference count says whether any is still alive.
    """

    def __init__(self, least: int = 32 << 20, keep: int = 2, most: int = 256 << 20) -> None:
        self.least, self.keep, self.most = least, keep, most
        self._blocks: list[np.ndarray] = []
        self._lock = threading.Lock()
        probe = [np.empty(0)]  # what the count reads for a block referenced by the list only
        self._unused = self._count(probe, 0)

    @staticmethod
    def _count(blocks: list[np.ndarray], i: int) -> int:
        return sys.getrefcount(blocks[i])

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes < self.least or nbytes > self.most:
            return np.empty(shape, dtype)
        with self._lock:
            blocks = self._blocks
            free = [i for i in range(len(blocks)) if self._count(blocks, i) <= self._unused]
            fits = [i for i in free if blocks[i].nbytes >= nbytes]
            if fits:
                block = blocks[min(fits, key=lambda i: blocks[i].nbytes)]
            else:
                block = np.empty(nbytes, np.uint8)
                # Make room by dropping free blocks, the smallest first; keep it if it fits.
                for i in sorted(free, key=lambda i: blocks[i].nbytes):
                    if self._room(blocks, nbytes):
                        break
                    blocks[i] = None
                blocks[:] = [b for b in blocks if b is not None]
                if self._room(blocks, nbytes):
                    blocks.append(block)
            return block[:nbytes].view(dtype).reshape(shape)

    def _room(self, blocks: list[np.ndarray | None], nbytes: int) -> bool:
        kept = [b for b in blocks if b is not None]
        return len(kept) < self.keep and sum(b.nbytes for b in kept) + nbytes <= self.most


OUTPUTS = OutputPool()


def qwen_patches(
    image: np.ndarray,
    height: int,
    width: int,
    patch: int,
    merge: int,
    temporal: int,
    normalize: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """An HxWx3 uint8 image, bicubic-resized to height x width, as Qwen-VL patch rows.

    Rows of 3*temporal*patch*patch uint8 values or, given float32 (mean, std) per channel,
    float32 (x - mean) / std.
    """
    image = np.ascontiguousarray(image)
    h_in, w_in, _ = image.shape
    dtype = np.uint8 if normalize is None else np.float32
    out = OUTPUTS.empty(((height // patch) * (width // patch), 3 * temporal * patch * patch), dtype)
    if normalize is not None:
        normalize = np.ascontiguousarray(normalize, np.float32)
    _kernels.qwen_patches(
        image, h_in, w_in, out, height, width,
        axis_argument(w_in, width, "bicubic"), axis_argument(h_in, height, "bicubic"),
        patch, merge, temporal, normalize,
    )  # fmt: skip
    return out
