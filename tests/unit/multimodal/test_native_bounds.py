"""The native kernels never read past their input: images end right before an unreadable page.

SIMD kernels load more bytes than a row holds; the last rows must come from a padded copy. A
read past the end of the input would crash the process (SIGSEGV), so the cases run in a child.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from multimodal import native

pytestmark = pytest.mark.skipif(not native.AVAILABLE, reason="native kernels not built")

CHILD = r"""
import ctypes, itertools, mmap
import numpy as np
from multimodal import native

PAGE = mmap.PAGESIZE
libc = ctypes.CDLL(None, use_errno=True)
libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
keep = []

def before_guard_page(height, width, channels, seed):
    size = height * width * channels
    pages = size // PAGE + 2
    buf = mmap.mmap(-1, pages * PAGE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    assert libc.mprotect(base + (pages - 1) * PAGE, PAGE, 0) == 0  # PROT_NONE
    keep.append(buf)
    image = np.frombuffer(buf, np.uint8, size, (pages - 1) * PAGE - size)
    image = image.reshape(height, width, channels)
    image[...] = np.random.default_rng(seed).integers(0, 256, image.shape, np.uint8)
    return image

cases = 0
for level in [lv for lv in native.LEVELS if native.level_supported(lv)]:
    with native.kernels(level):
        for h, w, c in itertools.product((1, 2, 3, 5), (1, 2, 3, 5, 8, 13, 100), (1, 3, 4)):
            image = before_guard_page(h, w, c, cases)
            # (100 -> 37 and 20: the wide AVX-512 width pass, its last pixels loaded masked)
            sizes = ((h + 1, 3 * w + 1), (h * 2, max(1, w // 2)), (4, 37), (3, max(1, w // 5)))
            for h_out, w_out in sizes:
                for method in ("bicubic", "bilinear"):
                    native.resize(image, h_out, w_out, method)
                    cases += 1
            if c == 3:  # the Qwen path: planar rows, the width pass two rows at a time
                for h_out, w_out in ((28, 28), (56, 84)):
                    native.qwen_patches(image, h_out, w_out, 14, 2, 2, None)
                    cases += 1
                # LLaVA-NeXT's tiles, ending right before a guard page too: the image over the
                # whole canvas, and smaller, so that the canvas's last bytes are padding
                for tile, rows, cols, top, left, h_out, w_out in (
                    (4, 1, 1, 0, 0, 4, 4),
                    (5, 2, 3, 0, 0, 10, 15),
                    (5, 2, 3, 2, 1, 7, 9),
                ):
                    flat = before_guard_page(rows * cols * 3 * tile, tile, 1, cases)
                    out = flat.reshape(rows, cols, 3, tile, tile)
                    native.tiles(image, h_out, w_out, "bicubic", out, top, left)
                    cases += 1
        for h, w in itertools.product((1, 3), (5, 63, 64, 65, 128, 130)):  # 64-pixel steps
            native.chw(before_guard_page(h, w, 3, cases))
            cases += 1
print(cases)
"""


@pytest.mark.slow  # a subprocess: a crash must not take pytest down
def test_narrow_images_are_not_read_past_their_end():
    child = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True)
    assert child.returncode == 0, f"exit {child.returncode}\n{child.stderr[-2000:]}"
    assert int(child.stdout) > 0


def test_the_narrow_cases_resize_as_numpy_does():
    """The child's narrow shapes in process, on ordinary buffers: at every SIMD level the
    kernels give numpy's bytes for them (the child checks only that they read nothing past)."""
    import itertools

    import numpy as np

    from multimodal.resize_numpy import resize_numpy

    rng = np.random.default_rng(0)
    for level in [lv for lv in native.LEVELS if native.level_supported(lv)]:
        with native.kernels(level):
            for h, w, c in itertools.product((1, 3, 5), (1, 5, 13, 100), (1, 3)):
                image = rng.integers(0, 256, (h, w, c), np.uint8)
                for h_out, w_out in ((h + 1, 3 * w + 1), (4, 37)):
                    for method in ("bicubic", "bilinear"):
                        got = native.resize(image, h_out, w_out, method)
                        want = resize_numpy(image, h_out, w_out, method)
                        assert np.array_equal(got, want), (level, h, w, c, h_out, w_out, method)
