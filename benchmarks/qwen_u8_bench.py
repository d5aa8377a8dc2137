"""Qwen2.5-VL JPEG uint8 patches against the decode alone: the "u8 within 1.3x of decode" target.

    python -m benchmarks.qwen_u8_bench [--repeats 41] [--sizes 640x480,1280x960,...]
                                       [--baseline DIR]

For each size, the photo-like JPEG of preprocess_bench (quality 90) is timed as preprocess_bench
times it: ``decode`` is ``decode_pixels(bytes)``, ``ours u8`` is decode + the Qwen2.5-VL
processor with ``raw_pixels=True``. Both run interleaved (one call of each per round, the order
rotated), single-threaded; the table shows medians and their ratio.

``--baseline DIR``: DIR holds another build of the kernels as ``DIR/baseline/_kernels*.so``
(e.g. the previous commit's); its ``ours u8`` runs interleaved with the current one in the same
rounds, and its output is checked equal to the current one's first. ``--baseline-no-pool``:
the baseline's outputs are plain ``np.empty`` arrays, as before ``native.OutputPool``.
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import contextlib  # noqa: E402
import glob  # noqa: E402
import importlib.util  # noqa: E402
import statistics  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from types import ModuleType  # noqa: E402

import numpy as np  # noqa: E402

from benchmarks.preprocess_bench import (  # noqa: E402
    encode,
    interleaved,
    load_average,
    our_decode,
    ours,
    photo_like,
)
from benchmarks.qwen_steps_bench import qwen25  # noqa: E402
from multimodal import decode, native  # noqa: E402

SIZES = "640x480,1280x960,1920x1080,3840x2160"


def load_baseline(directory: str) -> ModuleType:
    (path,) = glob.glob(os.path.join(directory, "baseline", "_kernels*.so"))
    # The module's last name component must be _kernels (its init function is PyInit__kernels).
    spec = importlib.util.spec_from_file_location("baseline._kernels", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def using(kernels: ModuleType, pool: bool) -> Iterator[None]:
    current, least = native._kernels, native.OUTPUTS.least
    native._kernels = kernels
    if not pool:
        native.OUTPUTS.least = 1 << 62
    try:
        yield
    finally:
        native._kernels, native.OUTPUTS.least = current, least


def variants(
    processor, data: bytes, baseline: ModuleType | None, pool: bool
) -> dict[str, Callable[[], object]]:
    def u8() -> np.ndarray:
        return ours(processor, our_decode(data), True)

    def base_u8() -> np.ndarray:
        with using(baseline, pool):
            return u8()

    fns = {"decode": lambda: our_decode(data), "u8": u8}
    if baseline:
        fns["base"] = base_u8
    return fns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=41)
    parser.add_argument("--sizes", default=SIZES, help="WIDTHxHEIGHT,...")
    parser.add_argument("--baseline", help="a dir with baseline/_kernels*.so")
    parser.add_argument(
        "--baseline-no-pool", action="store_true", help="baseline outputs without OutputPool"
    )
    args = parser.parse_args()
    if not native.AVAILABLE:
        raise SystemExit("the native kernels are not built: pip install -e .")
    baseline = load_baseline(args.baseline) if args.baseline else None
    processor = qwen25()
    print(
        f"kernels {native.simd_level()}, JPEG fast path {decode.FAST_JPEG}, "
        f"load average at start {load_average()}"
    )
    print(f"ms, median of {args.repeats} interleaved rounds (min in parentheses)")
    if baseline:
        pool = "without" if args.baseline_no_pool else "with"
        print(f"baseline: the kernels in {args.baseline} ({pool} OutputPool)")
    print()
    head = ["size", "decode", "ours u8", "u8/decode"]
    if baseline:
        head += ["baseline u8", "baseline u8/decode"]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for size in args.sizes.split(","):
        width, height = (int(v) for v in size.split("x"))
        data = encode(photo_like(width, height), "JPEG")
        fns = variants(processor, data, baseline, not args.baseline_no_pool)
        if baseline:
            assert np.array_equal(fns["u8"](), fns["base"]()), f"{size}: baseline output differs"
        for fn in fns.values():  # warm-up: weight tables, allocator
            fn()
        runs = interleaved(fns, args.repeats)
        med = {k: statistics.median(v) for k, v in runs.items()}
        low = {k: min(v) for k, v in runs.items()}
        cells = [size] + [f"{med[k]:.2f} ({low[k]:.2f})" for k in ("decode", "u8")]
        cells.append(f"{med['u8'] / med['decode']:.2f}x")
        if baseline:
            cells += [f"{med['base']:.2f} ({low['base']:.2f})"]
            cells.append(f"{med['base'] / med['decode']:.2f}x")
        print("| " + " | ".join(cells) + " |", flush=True)
    print(f"\nload average at end {load_average()}")


if __name__ == "__main__":
    main()
