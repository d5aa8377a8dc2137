"""Builds the optional native kernels; everything else about the package is in pyproject.toml.

multimodal._kernels (torchvision-exact resize and Qwen-VL patches, C sources in
multimodal/_native/) makes preprocessing several times faster. It is optional: without a C
compiler the install still succeeds, and multimodal.resize falls back to numpy, which computes
the same bytes. -O3 only: the AVX2 and AVX-512 kernels are chosen at run time
(multimodal/_native/cpu.h; `__attribute__((target))` per function, no -march), so one build
runs on any x86-64 CPU and builds elsewhere with the portable kernels.
"""

import sys

from setuptools import Extension, setup

NATIVE = "multimodal/_native"
SOURCES = ["module", "cpu", "resample", "qwen_patches", "chw"]
COMPILE_ARGS = [] if sys.platform == "win32" else ["-O3", "-std=c11", "-Wall", "-Wextra"]

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
