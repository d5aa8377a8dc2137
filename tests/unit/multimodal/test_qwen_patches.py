"""The native Qwen-VL path (resize and patch layout in one C pass) equals the numpy one.

processors/test_qwen_vl.py checks the default backend against transformers; this checks every
backend against numpy's resize + _patchify, on sizes that need no resize, one axis or
both, and on Qwen2-VL's and Qwen3-VL's patch sizes.  Also: the kernels refuse arguments that
do not fit, and release the GIL while they work.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from multimodal import native
from multimodal.processors.qwen_vl import QwenVLProcessor, QwenVLSettings
from tests.support import resize_backends

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def settings(patch: int, temporal: int = 2) -> QwenVLSettings:
    half = (0.5, 0.5, 0.5)
    return QwenVLSettings(
        patch_size=patch,
        merge_size=2,
        temporal_patch_size=temporal,
        min_pixels=56 * 56,
        max_pixels=28 * 28 * 1280,
        mean=CLIP_MEAN if patch == 14 else half,
        std=CLIP_STD if patch == 14 else half,
        rescale_factor=1 / 255,
        image_token_id=7,
    )


@pytest.fixture(params=[n for n in resize_backends.NAMES if n != "numpy"])
def backend(request):
    with resize_backends.using(request.param) as name:
        yield name


def noise(height: int, width: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), np.uint8)


# (height, width, options): no resize, width only, height only, both, upscale, strong downscale,
# both from an odd height (the AVX-512 width pass goes two rows at a time, the last one alone),
# 1009 -> 1008, whose width weights of 32640 and up split by per-output multipliers, and
# 2400 -> 196 wide (12x: the wide AVX-512 width pass, 2 lanes per output, planar rows)
CASES = [
    (224, 224, {}),
    (112, 120, {}),
    (130, 84, {}),
    (960, 1280, {}),
    (20, 30, {}),
    (1000, 700, {"max_pixels": 28 * 28 * 40}),
    (131, 97, {}),
    (57, 1009, {}),
    (1000, 2400, {"max_pixels": 28 * 28 * 20}),
]


@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float"])
@pytest.mark.parametrize(("patch", "temporal"), [(14, 2), (16, 2), (14, 1)])
@pytest.mark.parametrize(("height", "width", "options"), CASES)
def test_native_equals_numpy(backend, raw, patch, temporal, height, width, options):
    s = settings(patch, temporal)
    image = noise(height, width, seed=height + width)
    reference, ours = QwenVLProcessor(s, backend="numpy"), QwenVLProcessor(s, backend=backend)
    want = reference.process([image], reference.resolve(options), raw)
    got = ours.process([image], ours.resolve(options), raw)
    assert np.array_equal(got.tensors["image_grid_thw"], want.tensors["image_grid_thw"])
    pixels, expected = got.tensors["pixel_values"], want.tensors["pixel_values"]
    assert pixels.dtype == expected.dtype == (np.uint8 if raw else np.float32)
    np.testing.assert_array_equal(pixels, expected)


def test_non_contiguous_image(backend):
    s = settings(14)
    image = noise(300, 400)[::2, ::-1]
    reference, ours = QwenVLProcessor(s, backend="numpy"), QwenVLProcessor(s, backend=backend)
    want = reference.process([image], reference.resolve({}), True)
    got = ours.process([image], ours.resolve({}), True)
    np.testing.assert_array_equal(got.tensors["pixel_values"], want.tensors["pixel_values"])


def axis(n_in: int, n_out: int):
    return native.axis_argument(n_in, n_out, "bicubic")


@pytest.mark.skipif(not native.AVAILABLE, reason="multimodal._kernels is not built")
def test_kernels_refuse_arguments_that_do_not_fit():
    from multimodal import _kernels

    image = noise(60, 80)
    out = np.empty((56, 84, 3), np.uint8)
    with pytest.raises(ValueError, match="destination"):
        _kernels.resize(image, 60, 80, 3, out[:-1], 56, 84, axis(80, 84), axis(60, 56))
    with pytest.raises(ValueError, match="width weights missing"):
        _kernels.resize(image, 60, 80, 3, out, 56, 84, None, axis(60, 56))
    starts, sizes, weights, stride, precision = axis(80, 84)
    shifted = (starts + 5, sizes, weights, stride, precision)  # reads past the input's end
    with pytest.raises(ValueError, match="outside the input"):
        _kernels.resize(image, 60, 80, 3, out, 56, 84, shifted, axis(60, 56))
    patches = np.empty((4 * 6 - 1, 3 * 2 * 14 * 14), np.uint8)
    with pytest.raises(ValueError, match="wrong size"):
        _kernels.qwen_patches(image, 60, 80, patches, 56, 84, axis(80, 84), axis(60, 56),
                              14, 2, 2, None)  # fmt: skip
    with pytest.raises(ValueError, match="not a multiple"):
        _kernels.qwen_patches(image, 60, 80, patches, 50, 84, axis(80, 84), axis(60, 50),
                              14, 2, 2, None)  # fmt: skip
    floats = np.empty((4 * 6, 3 * 2 * 14 * 14), np.float32)
    with pytest.raises(ValueError, match="3 means and 3 stds"):
        _kernels.qwen_patches(image, 60, 80, floats, 56, 84, axis(80, 84), axis(60, 56),
                              14, 2, 2, np.ones(3, np.float32))  # fmt: skip


@pytest.mark.skipif(not native.AVAILABLE, reason="multimodal._kernels is not built")
def test_kernels_release_the_gil():
    """While a long native call runs in a thread, Python code keeps running in this one.

    Were the GIL held, this thread could not run during the call but for one switch interval
    (5 ms) at each end: its longest pause would cover nearly all of the call.
    """
    from multimodal import _kernels

    image = noise(2160, 3840)
    out = np.empty((154 * 274, 3 * 2 * 14 * 14), np.float32)  # 4K -> 2156x3836, as floats
    args = (image, 2160, 3840, out, 2156, 3836, axis(3840, 3836), axis(2160, 2156), 14, 2, 2)
    normalize = np.ones((2, 3), np.float32)
    window: list[float] = []

    def work() -> None:
        start = time.perf_counter()
        _kernels.qwen_patches(*args, normalize)
        window.extend((start, time.perf_counter()))

    thread = threading.Thread(target=work)
    stamps = []
    thread.start()
    while thread.is_alive():
        stamps.append(time.perf_counter())
    thread.join()
    start, end = window
    assert end - start > 0.03, "the call is too short to tell"
    points = [start] + [t for t in stamps if start < t < end] + [end]
    assert max(np.diff(points)) < 0.5 * (end - start)


def test_output_pool_reuses_only_released_blocks():
    pool = native.OutputPool(least=1000, keep=2, most=10**6)
    small = pool.empty((10, 10), np.uint8)
    assert small.base is None  # under `least`: a plain array
    a = pool.empty((100, 20), np.uint8)
    a_at = a.ctypes.data
    b = pool.empty((100, 20), np.uint8)
    assert b.ctypes.data != a_at  # a is alive
    view = a.reshape(-1)[10:]
    del a
    c = pool.empty((50, 10), np.float32)
    assert c.ctypes.data != a_at  # a view of a is alive
    del view, c
    d = pool.empty((50, 10), np.float32)
    assert d.ctypes.data == a_at and d.dtype == np.float32 and d.shape == (50, 10)
    d[:] = 1.5
    e = pool.empty((600, 1000), np.uint8)  # b is alive, d too: a third block is not kept
    assert len(pool._blocks) == 2
    del b
    f = pool.empty((700, 1000), np.uint8)  # b's block is dropped to keep this one
    assert sorted(blk.nbytes for blk in pool._blocks) == [2000, 700_000]
    assert pool.empty((2000, 1000), np.uint8).base is None  # over `most`: plain
    assert (d == 1.5).all() and e.shape == (600, 1000) and f.shape == (700, 1000)


def test_big_outputs_from_the_pool_stay_intact(backend):
    """Two 4K images in a row: the second output is not written over the first, still held."""
    s = settings(14)
    processor = QwenVLProcessor(s, backend=backend)
    options = {"max_pixels": 3840 * 2160}
    first = processor.process([noise(2160, 3840, seed=1)], processor.resolve(options), True)
    pixels = first.tensors["pixel_values"]
    assert pixels.nbytes >= native.OUTPUTS.least
    kept = pixels.copy()
    second = processor.process([noise(2160, 3840, seed=2)], processor.resolve(options), True)
    np.testing.assert_array_equal(pixels, kept)
    assert not np.array_equal(second.tensors["pixel_values"], kept)
    del first, pixels, second
    third = processor.process([noise(2160, 3840, seed=1)], processor.resolve(options), True)
    np.testing.assert_array_equal(third.tensors["pixel_values"], kept)
