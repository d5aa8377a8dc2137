"""Builds the optional native kernels; everything else about the package is in pyproject.toml.

multimodal._kernels (torchvision-exact resize, Qwen-VL patches, LLaVA tiles; C sources in
multimodal/_native/) makes preprocessing several times faster. It is optional: without a C
compiler the install still succeeds, and multimodal.resize falls back to numpy, which computes
the same bytes. -O3 only: the AVX2 and AVX-512 kernels are chosen at run time
(multimodal/_native/cpu.h; `__attribute__((target))` per function, no -march), so one build
runs on any x86-64 CPU and builds elsewhere with the portable kernels.

-fno-wrapv undoes the -fwrapv that extensions inherit from CPython's own build flags. CPython
needs wrapping signed arithmetic; these kernels never overflow a signed int (a UBSan build runs
the kernel tests clean), and with -fwrapv GCC gave up optimizations in their loops: the Qwen
resize ran 6-9% slower (measured in commit b269b3f; the end-to-end effect is in
benchmarks/RESULTS.md, "uint8 against the decode alone").
"""

import sys

from setuptools import Extension, setup

NATIVE = "multimodal/_native"
SOURCES = ["module", "cpu", "resample", "qwen_patches", "chw", "tiles"]
COMPILE_ARGS = (
    [] if sys.platform == "win32" else ["-O3", "-fno-wrapv", "-std=c11", "-Wall", "-Wextra"]
)

setup(
    # The C sources go into the sdist (setuptools adds them), not into wheels.
    exclude_package_data={"multimodal._native": ["*.c", "*.h"]},
    ext_modules=[
        Extension(
            "multimodal._kernels",
            sources=[f"{NATIVE}/{name}.c" for name in SOURCES],
            depends=[f"{NATIVE}/{name}.h" for name in SOURCES if name != "module"],
            extra_compile_args=COMPILE_ARGS,
            optional=True,
        )
    ],
)
