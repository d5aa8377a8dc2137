"""LLaVA-NeXT uint8 tiles: straight from the resizes (native.tiles) against the steps one by one.

    python -m benchmarks.llava_next_tiles_bench [--repeats 101] [--sizes 224x224,640x480,...]
                                                [--float]

For each size, the photo-like JPEG of preprocess_bench (quality 90): ``decode`` is
``decode_pixels(bytes)``; ``tiles`` and ``steps`` are decode + the LLaVA-NeXT processor
(llava-hf's CLIP-336 configs, as preprocess_bench builds them), once with the tiles written
directly by the kernels and once through the step-by-step path (resize, pad, slice, transpose
per tile), which the processor takes for configs whose tiles are resized again. All three run
interleaved (one call of each per round, the order rotated), single-threaded; the outputs are
checked equal first. The table shows medians and each path's ratio to the decode.
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from benchmarks.preprocess_bench import (  # noqa: E402
    build_llava,
    encode,
    interleaved,
    load_average,
    our_decode,
    photo_like,
)
from gateway.render.model_files import ModelFiles  # noqa: E402
from multimodal import native  # noqa: E402
from multimodal.registry import processor_for  # noqa: E402

SIZES = "224x224,640x480,1280x960,1920x1080,3840x2160"


def variants(processor, data: bytes, raw: bool) -> dict[str, Callable[[], np.ndarray]]:
    def run(direct: bool) -> Callable[[], np.ndarray]:
        def call() -> np.ndarray:
            processor._tiles_kept = direct
            image = np.asarray(our_decode(data))
            return processor.process([image], processor.resolve({}), raw_pixels=raw).tensors[
                "pixel_values"
            ]

        return call

    return {"decode": lambda: our_decode(data), "tiles": run(True), "steps": run(False)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=101)
    parser.add_argument("--sizes", default=SIZES, help="WIDTHxHEIGHT,...")
    parser.add_argument("--float", action="store_true", help="normalized float32, not uint8")
    args = parser.parse_args()
    if not native.AVAILABLE:
        raise SystemExit("the native kernels are not built: pip install -e .")
    with tempfile.TemporaryDirectory() as tmp:
        processor = processor_for(ModelFiles.load(build_llava("llava_next")(Path(tmp) / "model")))
    print(f"kernels {native.simd_level()}, load average at start {load_average()}")
    kind = "float32" if args.float else "uint8"
    print(f"{kind}, ms, median of {args.repeats} interleaved rounds\n")
    print("| size | decode | tiles | tiles/decode | steps | steps/decode | saved |")
    print("|---|---|---|---|---|---|---|")
    for size in args.sizes.split(","):
        width, height = (int(v) for v in size.split("x"))
        fns = variants(processor, encode(photo_like(width, height), "JPEG"), not args.float)
        assert np.array_equal(fns["tiles"](), fns["steps"]()), f"{size}: the paths differ"
        for fn in fns.values():  # warm-up: weight tables, allocator
            fn()
        med = {k: statistics.median(v) for k, v in interleaved(fns, args.repeats).items()}
        d, t, s = med["decode"], med["tiles"], med["steps"]
        print(
            f"| {size} | {d:.3f} | {t:.3f} | {t / d:.3f}x | {s:.3f} | {s / d:.3f}x | {s - t:.3f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
