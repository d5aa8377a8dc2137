"""The ways to run multimodal's resize, for tests that check each against the same reference.

"native-avx512" (the C kernels with AVX-512, as CPUs with AVX-512 F/BW/VL/VBMI/VNNI run them),
"native-avx2" (with AVX2 only, as other x86-64 CPUs run them), "native-portable" (the C kernels
without SIMD intrinsics, as on other architectures) and "numpy".  The native ones are skipped,
visibly, when the extension is not built or this CPU cannot run them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from multimodal import native
from multimodal.resize import BACKENDS

NAMES = ("native-avx512", "native-avx2", "native-portable", "numpy")
LEVELS = {"native-avx512": "avx512", "native-avx2": "avx2", "native-portable": "generic"}


@contextlib.contextmanager
def using(name: str) -> Iterator[str]:
    """Run the body with backend `name`; yields what to pass as resize's `backend`."""
    if name == "numpy":
        yield "numpy"
        return
    if "native" not in BACKENDS:
        pytest.skip("multimodal._kernels is not built (no C compiler at install time?)")
    level = LEVELS[name]
    if not native.level_supported(level):
        pytest.skip(f"no {level} kernels here: the CPU lacks them, or a -DMMGATE_PORTABLE build")
    with native.kernels(level):
        yield "native"
