"""multimodal.native.chw: HWC uint8 to channel planes, exactly numpy's transpose, at every
kernel level (the width pass's row split: AVX-512 64 pixels a step, AVX2 16, else byte by
byte), for crops' strided views too."""

from __future__ import annotations

import numpy as np
import pytest

from multimodal import native
from tests.support import resize_backends

pytestmark = pytest.mark.skipif(not native.AVAILABLE, reason="native kernels not built")


@pytest.fixture(params=[n for n in resize_backends.NAMES if n != "numpy"])
def level(request):
    with resize_backends.using(request.param):
        yield request.param


def image(height: int, width: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), np.uint8)


@pytest.mark.parametrize("width", [1, 5, 63, 64, 65, 127, 128, 336, 337])
def test_planes_are_the_transpose(width, level):
    pixels = image(7, width, seed=width)
    np.testing.assert_array_equal(native.chw(pixels), pixels.transpose(2, 0, 1))


def test_a_crop_of_a_larger_image(level):
    canvas = image(700, 1000)
    crop = canvas[3:339, 5:341]  # rows 3000 bytes apart, as LLaVA-NeXT's tiles
    out = np.full((3, 336, 336), 7, np.uint8)
    assert native.chw(crop, out) is out
    np.testing.assert_array_equal(out, crop.transpose(2, 0, 1))
    assert np.array_equal(canvas[3:339, 5:341], crop)  # the source is not written


def test_views_with_unpacked_pixels_are_copied_first(level):
    pixels = image(9, 70)
    for view in (pixels[:, :, ::-1], pixels[:, ::2], pixels[::-1]):
        np.testing.assert_array_equal(native.chw(view), view.transpose(2, 0, 1))


@pytest.mark.parametrize(
    ("src", "out"),
    [
        (np.zeros((4, 4, 2), np.uint8), np.zeros((2, 4, 4), np.uint8)),
        (np.zeros((4, 4, 3), np.float32), np.zeros((3, 4, 4), np.float32)),
        (np.zeros((4, 4, 3), np.uint8), np.zeros((3, 4, 5), np.uint8)),
        (np.zeros((0, 4, 3), np.uint8), np.zeros((3, 0, 4), np.uint8)),
    ],
)
def test_rejects_what_is_not_an_rgb_image(src, out):
    with pytest.raises(ValueError):
        native._kernels.chw(src, out)


def test_llava_finish_is_the_same_without_the_kernels(monkeypatch):
    """LLaVA's last step, CHW uint8 or normalized float32, with and without native.chw and
    native.normalize."""
    from multimodal.processors import pixels, transforms

    settings = pixels.pixel_settings(
        {
            "size": {"shortest_edge": 336},
            "crop_size": {"height": 336, "width": 336},
            "image_mean": [0.48145466, 0.4578275, 0.40821073],
            "image_std": [0.26862954, 0.26130258, 0.27577711],
        }
    )
    pipeline = pixels.PixelPipeline(settings)
    crop = image(400, 500)[20:356, 30:366]
    with_kernels = [pipeline.finish(crop, raw) for raw in (True, False)]
    monkeypatch.setattr(transforms.native, "AVAILABLE", False)
    monkeypatch.setattr(transforms.native, "HAS_NORMALIZE", False)  # numpy's normalize too
    without = [pipeline.finish(crop, raw) for raw in (True, False)]
    for ours, numpy_only in zip(with_kernels, without):
        assert ours.dtype == numpy_only.dtype and ours.shape == (3, 336, 336)
        np.testing.assert_array_equal(ours, numpy_only)


# native.normalize: uint8 planes to float32 (x - mean[c]) / std[c], the very floats numpy's
# subtract then divide give (PixelPipeline.normalize's numpy path), 8 values a step with AVX2
# and the rest (or everything, portable) one by one.
MEAN_STD = np.array([122.7709, 116.746, 104.0937, 68.5005, 66.6322, 70.3232], np.float32)


def numpy_normalize(planes: np.ndarray, mean_std: np.ndarray) -> np.ndarray:
    mean, std = mean_std[:3, None, None], mean_std[3:, None, None]
    return np.divide(np.subtract(planes, mean, dtype=np.float32), std)


@pytest.mark.parametrize("shape", [(3, 1, 1), (3, 1, 7), (3, 3, 3), (3, 16, 17), (5, 3, 37, 41)])
def test_normalize_is_numpy_s_subtract_then_divide(shape, level):
    planes = np.random.default_rng(sum(shape)).integers(0, 256, shape, np.uint8)
    out = np.full(shape, np.nan, np.float32)
    assert native.normalize(planes, MEAN_STD, out) is out
    np.testing.assert_array_equal(out, numpy_normalize(planes, MEAN_STD))


def test_normalize_every_value_in_every_channel(level):
    planes = np.broadcast_to(np.arange(256, dtype=np.uint8), (2, 3, 4, 256)).copy()
    for mean_std in (MEAN_STD, np.array([127.5] * 6, np.float32)):
        out = native.normalize(planes, mean_std, np.empty(planes.shape, np.float32))
        np.testing.assert_array_equal(out, numpy_normalize(planes, mean_std))


@pytest.mark.parametrize(
    ("planes", "out"),
    [
        (np.zeros((2, 4, 4), np.uint8), np.zeros((2, 4, 4), np.float32)),  # not 3 channels
        (np.zeros((3, 4, 4), np.uint8), np.zeros((3, 4, 4), np.float64)),
        (np.zeros((3, 4, 4), np.uint8), np.zeros((3, 4, 5), np.float32)),
        (np.zeros((3, 4, 8), np.uint8)[:, :, ::2], np.zeros((3, 4, 4), np.float32)),
    ],
)
def test_normalize_refuses_other_layouts(planes, out):
    with pytest.raises(ValueError):
        native.normalize(planes, MEAN_STD, out)
    with pytest.raises(ValueError):  # the kernel's own checks: sizes that do not add up
        native._kernels.normalize(np.zeros(12, np.uint8), 4, 4, MEAN_STD, np.zeros(11, np.float32))
