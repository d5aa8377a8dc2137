"""multimodal.resize must give exactly torchvision's uint8 CPU resize (HF torchvision backend).

Every comparison runs on each backend (tests/support/resize_backends.py): the native kernels with
AVX-512, with AVX2 and without SIMD (skipped, visibly, if the extension is not built or the CPU
cannot run them) and numpy.
"""

from __future__ import annotations

import numpy as np
import pytest

from multimodal.resize import axis_weights, resize
from tests.support import resize_backends

torch = pytest.importorskip("torch")
tvf = pytest.importorskip("torchvision.transforms.v2.functional")
from torchvision.transforms import InterpolationMode  # noqa: E402

METHODS = ["bicubic", "bilinear", "lanczos"]
MODES = {
    "bicubic": InterpolationMode.BICUBIC,
    "bilinear": InterpolationMode.BILINEAR,
    "lanczos": InterpolationMode.LANCZOS,
}


@pytest.fixture(params=resize_backends.NAMES)
def backend(request):
    with resize_backends.using(request.param) as name:
        yield name


def torchvision_resize(image: np.ndarray, height: int, width: int, method: str) -> np.ndarray:
    """What an HF processor computes: contiguous uint8 CHW tensor, antialias=True."""
    chw = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1)
    if not (height == width == 1 and image.shape[2] == 3):
        chw = chw.contiguous()
    # else: torch trips an internal assert (UpSampleKernelAVXAntialias.h) for a contiguous
    # 3-channel tensor resized to 1x1; the channels-last view takes the same kernel.
    out = tvf.resize(chw, [height, width], interpolation=MODES[method], antialias=True)
    return out.permute(1, 2, 0).numpy()


def assert_same(image: np.ndarray, height: int, width: int, method: str, backend: str) -> None:
    ours = resize(image, height, width, method, backend)
    ref = torchvision_resize(image, height, width, method)
    assert ours.shape == ref.shape == (height, width, image.shape[2])
    assert ours.dtype == np.uint8
    if not np.array_equal(ours, ref):
        diff = np.abs(ours.astype(int) - ref.astype(int))
        pytest.fail(
            f"{backend}: {image.shape} -> {(height, width)} {method}: {np.count_nonzero(diff)} "
            f"pixels "
            f"differ, max {diff.max()}"
        )


def noise(height: int, width: int, channels: int = 3, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, channels), np.uint8)


# (input HxW, output HxW)
DOWNSCALES = [
    ((960, 1280), (924, 1232)),  # Qwen smart_resize with a large max_pixels
    ((960, 1280), (336, 448)),
    ((960, 1280), (840, 1148)),  # Qwen2-VL default max_pixels
    ((1080, 1920), (336, 597)),  # CLIP shortest_edge=336
    ((1000, 1500), (500, 750)),  # exactly 2x
    ((900, 900), (300, 300)),  # exactly 3x
    ((700, 900), (101, 129)),  # ~7x: p > 16, float64 path
    ((2000, 300), (40, 290)),  # 50x on one axis
    ((20, 3000), (5, 7)),  # 430x: over a thousand taps per output
]
UPSCALES = [
    ((23, 37), (56, 56)),
    ((50, 100), (476, 644)),
    ((28, 28), (56, 84)),
    ((3, 2), (200, 150)),
]
MIXED = [
    ((480, 640), (476, 644)),  # Pillow differs by up to 22 here (pass order)
    ((100, 300), (300, 100)),
    ((640, 48), (60, 500)),
]
EDGES = [
    ((64, 48), (64, 48)),  # identity: torchvision returns the input
    ((64, 48), (64, 100)),  # width only
    ((64, 48), (10, 48)),  # height only
    ((1, 50), (7, 13)),
    ((50, 1), (1, 20)),
    ((1, 1), (5, 5)),
    ((9, 9), (1, 9)),
    ((9, 9), (9, 1)),
    ((9, 9), (1, 1)),
    ((2, 2), (1, 1)),
]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(("src", "dst"), DOWNSCALES + UPSCALES + MIXED + EDGES)
def test_matches_torchvision(src, dst, method, backend):
    assert_same(noise(*src, seed=sum(src) + sum(dst)), *dst, method, backend)


@pytest.mark.parametrize("method", METHODS)
def test_4k_to_qwen_size(method, backend):
    image = noise(2160, 3840)
    assert_same(image, 728, 1316, method, backend)  # Qwen2-VL default max_pixels = 28*28*1280
    assert_same(image, 1092, 1932, method, backend)  # max_pixels = 28*28*2700 (~2.1 MP)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("channels", [1, 2, 4])
def test_other_channel_counts(channels, method, backend):
    image = noise(120, 90, channels)
    assert_same(image, 77, 150, method, backend)
    assert_same(image, 200, 31, method, backend)


def test_strided_input(backend):
    image = noise(90, 140, 4)[5:80:2, 130:10:-3, :3]  # a view: neither contiguous nor forward
    assert_same(image, 29, 57, "bicubic", backend)


def test_grayscale_2d_input(backend):
    image = noise(60, 80, 1)
    ours = resize(image[:, :, 0], 33, 47, backend=backend)
    assert ours.shape == (33, 47)
    np.testing.assert_array_equal(ours, torchvision_resize(image, 33, 47, "bicubic")[:, :, 0])


def structured_images(height: int, width: int) -> dict[str, np.ndarray]:
    y, x = np.mgrid[0:height, 0:width]
    gradient = np.stack(
        [x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1), (x + y) % 256], axis=-1
    ).astype(np.uint8)
    checker = np.repeat((((x + y) % 2) * 255).astype(np.uint8)[:, :, None], 3, axis=2)
    blocks = np.repeat(((((x // 7) + (y // 5)) % 2) * 255).astype(np.uint8)[:, :, None], 3, 2)
    wave = np.sin(x / 9.0) * np.cos(y / 13.0)
    smooth = 127.5 + 127.5 * wave[:, :, None] * np.array([1.0, 0.6, 0.3])
    return {
        "gradient": gradient,
        "checker": checker,  # maximal overshoot: exercises clamping of both passes
        "blocks": blocks,
        "smooth": np.round(smooth).astype(np.uint8),
        "white": np.full((height, width, 3), 255, np.uint8),
        "black": np.zeros((height, width, 3), np.uint8),
        "sparse": (noise(height, width, seed=3) > 250).astype(np.uint8) * 255,
    }


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(("src", "dst"), [((480, 640), (476, 644)), ((960, 1280), (336, 448))])
def test_structured_images(src, dst, method, backend):
    for name, image in structured_images(*src).items():
        ours = resize(image, *dst, method, backend)
        np.testing.assert_array_equal(ours, torchvision_resize(image, *dst, method), err_msg=name)


# The AVX-512 width pass (3 channels) takes output pixels 16 at a time from a 128-byte window and
# reads the row's last window masked; wider downscales (about 2.2x bicubic) take the wide layout.
# It goes 4 taps a step when each output's weights split into signed-byte halves (m * high +
# low): by m = 256 for nearly all plans; weights of 32640 and up (1000 -> 999, 3840 -> 3836) by
# each output's own m; 2 taps a step when some output's weights split by no m (655 -> 653 and
# 788 -> 784 bicubic: 32666 or 32643 beside a weight of 128).
# Wider downscales take the wide AVX-512 layout (h_row_rgb_wide): the row split into channel
# planes, each output 1, 2 or 4 lanes of 4 taps (of those that fit, the least estimated cost),
# each group's 128-byte window loaded once or, when its taps reach past it, moved along: 2.5x to
# 12x (Qwen, CLIP sizes: 1 lane, 2 from 3840), moved windows with 1 lane (2000 -> 250 bilinear),
# 2 (3000 -> 200 bilinear, 700 -> 3 bicubic) and 4 (4000 -> 130), 4 fixed (3000 -> 200 bicubic),
# partial last groups, fewer outputs than a group, weights of 32640 and up (100 -> 11, 191 -> 21
# bilinear; 261 -> 15 bicubic, 2 lanes moving: multipliers), 765 -> 191 bilinear (some output's
# weights split by none: AVX2), 6000 -> 150 (beyond 4 lanes: AVX2); 129 -> 6 bicubic and
# 138 -> 16 bilinear reach exactly to a window's end (a tap 128 pixels on with 2 lanes fixed; 1
# lane's first steps 129 pixels on), so that an off-by-one in the layout's choice fails.
# Widths: near 1:1 (Qwen), around that limit on both sides, partial last groups, tiny rows.
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(
    ("w_in", "w_out"),
    [(1280, 1288), (1280, 1232), (1287, 1300), (1000, 455), (1000, 435), (1000, 400),
     (1000, 380), (100, 47), (17, 16), (16, 17), (5, 33), (42, 21), (43, 1), (1000, 999),
     (3840, 3836), (655, 653), (788, 784),
     (640, 252), (1000, 333), (1920, 336), (3840, 336), (2000, 250), (3000, 200), (4000, 130),
     (300, 17), (700, 3), (130, 1), (100, 11), (191, 21), (261, 15), (765, 191), (6000, 150),
     (129, 6), (138, 16)],
)  # fmt: skip
def test_width_pass_layouts(w_in, w_out, method, backend):
    for name, image in structured_images(6, w_in).items():
        ours = resize(image, 6, w_out, method, backend)
        np.testing.assert_array_equal(ours, torchvision_resize(image, 6, w_out, method), name)
    assert_same(noise(7, w_in, seed=w_in + w_out), 7, w_out, method, backend)


def test_width_pass_lanczos_ratios(backend):
    """Lanczos has 6 taps per output at 1:1 and 6x the scale downscaling, so the AVX-512 width
    pass switches layouts (16-pixel groups, tap quads or pairs, the wide layout's lanes) at
    other ratios than the hand-picked bicubic and bilinear ones above: sweep the ratios."""
    for w_in in (1000, 1456):
        for w_out in sorted({max(1, round(w_in * r / 64)) for r in range(2, 140, 3)}):
            image = noise(5, w_in, seed=w_out)
            assert_same(image, 5, w_out, "lanczos", backend)


def test_random_sizes(backend):
    rng = np.random.default_rng(1234)
    for i in range(80):
        h_in, w_in, h_out, w_out = (int(v) for v in rng.integers(1, 260, 4))
        if i % 10 == 0:
            h_in = int(rng.integers(500, 1500))  # strong downscale
        if i % 10 == 5:
            w_in = int(rng.integers(500, 1500))  # strong downscale of the width: many taps
        image = rng.integers(0, 256, (h_in, w_in, 3), np.uint8)
        assert_same(image, h_out, w_out, METHODS[i % len(METHODS)], backend)


def test_weights_are_fixed_point_of_one():
    for n_in, n_out in [(1280, 1148), (37, 56), (3840, 1316), (9, 1)]:
        for method in METHODS:
            w = axis_weights(n_in, n_out, method)
            assert np.abs(w.weights).max() < 1 << 15  # int16, like torch
            sums = w.weights.sum(axis=1)
            assert np.all(np.abs(sums - (1 << w.precision)) <= w.weights.shape[1])


def test_returns_copy_for_same_size(backend):
    image = noise(10, 12)
    out = resize(image, 10, 12, backend=backend)
    np.testing.assert_array_equal(out, image)
    assert out is not image


@pytest.mark.parametrize(
    ("image", "size", "method"),
    [
        (np.zeros((4, 4, 3), np.float32), (2, 2), "bicubic"),
        (np.zeros((4, 4, 3, 1), np.uint8), (2, 2), "bicubic"),
        (np.zeros((4, 4, 3), np.uint8), (0, 2), "bicubic"),
        (np.zeros((4, 4, 3), np.uint8), (2, 2), "box"),
    ],
)
def test_rejects_bad_input(image, size, method, backend):
    with pytest.raises(ValueError):
        resize(image, *size, method, backend)


def test_rejects_unknown_backend():
    with pytest.raises(ValueError, match="not available"):
        resize(noise(4, 4), 2, 2, backend="opencv")


# A window of the resized image (LLaVA's center crop): the pixels of slicing torchvision's whole
# result. The native kernels compute only the window's outputs, from sliced weights; an axis
# that keeps its size is cut from the input instead.
WINDOWS = [
    ((1080, 1920), (336, 597), (0, 130, 336, 336)),  # CLIP: shortest edge 336, center crop
    ((1920, 1080), (597, 336), (130, 0, 336, 336)),  # the same, portrait
    ((960, 1280), (336, 448), (0, 56, 336, 336)),
    ((2160, 3840), (336, 597), (0, 130, 336, 336)),  # 6-11x: many taps per output
    ((480, 640), (476, 644), (3, 5, 400, 600)),  # near 1:1, both axes cropped
    ((336, 900), (336, 700), (0, 182, 336, 336)),  # height unchanged: rows cut from the input
    ((500, 336), (300, 336), (10, 17, 280, 300)),  # width unchanged: columns cut from the input
    ((64, 48), (64, 48), (8, 4, 40, 40)),  # no resize at all
    ((50, 70), (20, 30), (19, 29, 1, 1)),  # one pixel, at the corner
    ((9, 1000), (5, 455), (1, 16, 3, 33)),  # a window not aligned to 16-pixel groups
]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(("src", "dst", "crop"), WINDOWS)
def test_window_of_the_resize(src, dst, crop, method, backend):
    image = noise(*src, seed=sum(src) + sum(crop))
    top, left, h, w = crop
    ours = resize(image, *dst, method, backend, crop=crop)
    whole = torchvision_resize(image, *dst, method)
    np.testing.assert_array_equal(ours, whole[top : top + h, left : left + w])


@pytest.mark.parametrize("crop", [(0, 0, 0, 5), (0, 0, 5, -1), (-1, 0, 5, 5), (0, 2, 5, 9)])
def test_window_must_lie_inside(crop, backend):
    with pytest.raises(ValueError, match="not inside"):
        resize(noise(20, 20), 10, 10, backend=backend, crop=crop)


def test_random_windows(backend):
    """Windows anywhere in random resizes (up, down, 1:1 on an axis): the kernels' layouts must
    hold for any slice of an axis's weights, not only for centered crops."""
    rng = np.random.default_rng(4321)
    for i in range(60):
        h_in, w_in = (int(v) for v in rng.integers(1, 400, 2))
        h_out = h_in if i % 7 == 0 else int(rng.integers(1, 300))
        w_out = w_in if i % 11 == 0 else int(rng.integers(1, 300))
        crop_h, crop_w = int(rng.integers(1, h_out + 1)), int(rng.integers(1, w_out + 1))
        top, left = (
            int(rng.integers(0, h_out - crop_h + 1)),
            int(rng.integers(0, w_out - crop_w + 1)),
        )
        image = rng.integers(0, 256, (h_in, w_in, 3), np.uint8)
        method = METHODS[i % len(METHODS)]
        ours = resize(image, h_out, w_out, method, backend, crop=(top, left, crop_h, crop_w))
        whole = torchvision_resize(image, h_out, w_out, method)
        np.testing.assert_array_equal(
            ours, whole[top : top + crop_h, left : left + crop_w], err_msg=f"case {i}"
        )
