"""The ways to run multimodal's resize, for tests that check each against the same reference.

"native" (the C kernels as this CPU runs them, AVX2 on most x86-64), "native-portable" (the C
kernels without SIMD intrinsics, as on other CPUs) and "numpy".  The native ones are skipped,
visibly, when the extension is not built.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from multimodal import native
from multimodal.resize import BACKENDS

NAMES = ("native", "native-portable", "numpy")


@contextlib.contextmanager
def using(name: str) -> Iterator[str]:
    """Run the body with backend `name`; yields what to pass as resize's `backend`."""
    if name == "numpy":
        yield "numpy"
        return
    if "native" not in BACKENDS:
        pytest.skip("multimodal._kernels is not built (no C compiler at install time?)")
    if name == "native-portable":
        with native.portable_kernels():
            yield "native"
    else:
        yield "native"
