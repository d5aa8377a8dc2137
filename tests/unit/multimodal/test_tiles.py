"""multimodal.native.tiles: a resize laid on a zero canvas cut into CHW tiles (LLaVA-NeXT's
anyres grid and base tile), the same bytes as the resize, numpy's pad, slicing and transpose,
at every kernel level; and LLaVA-NeXT's batches made that way equal the step-by-step ones."""

from __future__ import annotations

import numpy as np
import pytest

from multimodal import native
from multimodal.processors import llava_next
from multimodal.resize import resize
from tests.support import resize_backends

pytestmark = pytest.mark.skipif(not native.AVAILABLE, reason="native kernels not built")


@pytest.fixture(params=[n for n in resize_backends.NAMES if n != "numpy"])
def level(request):
    with resize_backends.using(request.param):
        yield request.param


def reference(image, height, width, method, tile, rows, cols, top, left, crop=None):
    resized = resize(image, height, width, method, crop=crop)
    canvas = np.zeros((rows * tile, cols * tile, 3), np.uint8)
    canvas[top : top + resized.shape[0], left : left + resized.shape[1]] = resized
    return canvas.reshape(rows, tile, cols, tile, 3).transpose(0, 2, 4, 1, 3)


def test_random_layouts_are_resize_pad_and_transpose(level):
    rng = np.random.default_rng(3)
    for case in range(60):
        h_in, w_in = (int(v) for v in rng.integers(1, 500, 2))
        image = rng.integers(0, 256, (h_in, w_in, 3), np.uint8)
        tile, rows, cols = int(rng.integers(1, 70)), *(int(v) for v in rng.integers(1, 4, 2))
        height, width = int(rng.integers(1, rows * tile + 1)), int(rng.integers(1, cols * tile + 1))
        if case % 5 == 0:  # the height keeps its size; every tenth case the width too
            height = min(h_in, rows * tile)
            image = image[:height]
        if case % 10 == 0:
            width = min(w_in, cols * tile)
            image = image[:, :width]
        top = int(rng.integers(0, rows * tile - height + 1))
        left = int(rng.integers(0, cols * tile - width + 1))
        method = ("bicubic", "bilinear")[case % 2]
        out = np.full((rows, cols, 3, tile, tile), 7, np.uint8)  # every byte must be written
        assert native.tiles(image, height, width, method, out, top, left) is out
        want = reference(image, height, width, method, tile, rows, cols, top, left)
        np.testing.assert_array_equal(out, want, err_msg=f"case {case}")


def test_anyres_grid_of_a_photo_sized_image(level):
    """1280x960 -> 504x672 centred on 672x672: 2 x 2 tiles of 336, padding above and below."""
    image = np.random.default_rng(0).integers(0, 256, (960, 1280, 3), np.uint8)
    out = np.empty((2, 2, 3, 336, 336), np.uint8)
    native.tiles(image, 504, 672, "bicubic", out, 84, 0)
    np.testing.assert_array_equal(out, reference(image, 504, 672, "bicubic", 336, 2, 2, 84, 0))
    assert not out[0, :, :, :84].any() and not out[1, :, :, 252:].any()  # canvas rows 0-83, 588-671
    assert out[0, :, :, 84:].any() and out[1, :, :, :252].any()


def test_a_crop_window(level):
    image = np.random.default_rng(1).integers(0, 256, (300, 400, 3), np.uint8)
    out = np.empty((1, 1, 3, 64, 64), np.uint8)
    native.tiles(image, 90, 120, "bicubic", out, 2, 3, crop=(10, 20, 60, 50))
    want = reference(image, 90, 120, "bicubic", 64, 1, 1, 2, 3, crop=(10, 20, 60, 50))
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize(
    ("height", "width", "top", "left", "shape"),
    [
        (10, 10, 1, 0, (1, 1, 3, 10, 10)),  # one row too low
        (10, 10, 0, 1, (1, 1, 3, 10, 10)),  # one column too far right
        (4, 4, -1, 0, (1, 1, 3, 10, 10)),
        (4, 4, 0, 0, (1, 1, 3, 10, 9)),  # tiles not square
        (4, 4, 0, 0, (1, 1, 2, 10, 10)),  # not 3 channels
    ],
)
def test_what_does_not_fit_is_refused(height, width, top, left, shape):
    image = np.zeros((8, 8, 3), np.uint8)
    with pytest.raises(ValueError):
        native.tiles(image, height, width, "bicubic", np.zeros(shape, np.uint8), top, left)


def test_a_tile_buffer_of_the_wrong_size_is_refused():
    image = np.zeros((8, 8, 3), np.uint8)
    axis = native.axis_argument(8, 4, "bicubic")
    small = np.zeros(3 * 4 * 4 - 1, np.uint8)
    with pytest.raises(ValueError, match="wrong size"):
        native._kernels.tiles(image, 8, 8, small, 4, 4, axis, axis, 4, 1, 1, 0, 0)


@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float"])
def test_llava_next_batches_equal_the_step_by_step_ones(tmp_path, raw):
    """Tiles straight from the kernels against transformers' steps one by one (resize, pad,
    slice, resize_and_crop, finish): a ragged batch, an image whose fitted size is the base
    (the resize done once), images that keep their size on an axis, tiny and large ones."""
    from tests.support import load_processor
    from tests.support.llava_models import build_model

    processor = load_processor(build_model(tmp_path, "llava_next"))
    assert isinstance(processor, llava_next.LlavaNextProcessor) and processor._tiles_kept
    rng = np.random.default_rng(5)
    sizes = [(224, 224), (960, 1280), (12, 10), (336, 672), (672, 336), (1080, 1920), (500, 33)]
    images = [rng.integers(0, 256, (h, w, 3), np.uint8) for h, w in sizes]
    fast = processor.process(images, processor.resolve({}), raw_pixels=raw).tensors["pixel_values"]
    processor._tiles_kept = False
    slow = processor.process(images, processor.resolve({}), raw_pixels=raw).tensors["pixel_values"]
    assert fast.dtype == slow.dtype == (np.uint8 if raw else np.float32)
    assert fast.shape == slow.shape == (7, 5, 3, 336, 336)
    np.testing.assert_array_equal(fast, slow)
