"""Time multimodal.resize (native kernels and numpy) against torchvision and Pillow.

    python -m benchmarks.resize_bench [--method bilinear] [--repeats 15]

torchvision's resize is what the HF processors run.  Everything runs single-threaded
(torch.set_num_threads(1); OPENBLAS_NUM_THREADS defaults to 1, set it before running to let
the numpy backend's BLAS use more cores).  Reports the fastest and the median run; `same` says
whether both of our backends gave torchvision's bytes.
"""

from __future__ import annotations

import os

# Must precede the numpy import: OpenBLAS reads it once, when loaded.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import functools  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from multimodal import native  # noqa: E402
from multimodal.resize import BACKENDS, resize  # noqa: E402


def qwen_size(height: int, width: int, factor: int = 28, max_pixels: int = 28 * 28 * 1280):
    """transformers' qwen2_vl smart_resize (min_pixels never binds for these inputs)."""
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    return h_bar, w_bar


def clip_size(height: int, width: int, shortest_edge: int = 336):
    """CLIP's resize before its center crop: shortest edge to 336, aspect kept."""
    if height <= width:
        return shortest_edge, int(shortest_edge * width / height)
    return int(shortest_edge * height / width), shortest_edge


def timed(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    fn()  # warm caches (weight tables, allocator)
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - start) * 1e3)
    return min(runs), statistics.median(runs)


def torchvision_resizer(method: str):
    try:
        import torch
        from torchvision.transforms import InterpolationMode
        from torchvision.transforms.v2 import functional as tvf
    except ImportError:
        return None
    torch.set_num_threads(1)
    mode = InterpolationMode.BICUBIC if method == "bicubic" else InterpolationMode.BILINEAR

    def prepare(image: np.ndarray):
        return torch.from_numpy(image).permute(2, 0, 1).contiguous()  # as HF does

    def run(chw, height: int, width: int) -> np.ndarray:
        out = tvf.resize(chw, [height, width], interpolation=mode, antialias=True)
        return out.permute(1, 2, 0).numpy()

    return prepare, run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", choices=["bicubic", "bilinear"], default="bicubic")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()

    cases = [
        ("1280x960 -> Qwen2.5-VL", (960, 1280), qwen_size(960, 1280, max_pixels=12845056)),
        ("1280x960 -> Qwen2-VL", (960, 1280), qwen_size(960, 1280)),
        ("3840x2160 -> Qwen2-VL", (2160, 3840), qwen_size(2160, 3840)),
        ("1920x1080 -> CLIP", (1080, 1920), clip_size(1080, 1920)),
    ]
    pil_filter = Image.Resampling.BICUBIC if args.method == "bicubic" else Image.Resampling.BILINEAR
    tv = torchvision_resizer(args.method)
    rng = np.random.default_rng(0)
    kernels = native.simd_level() or "not built"
    print(f"{args.method}, single thread, ms per resize (min / median of {args.repeats} runs)")
    print(f"native kernels: {kernels}")
    head = ["native", "numpy", "torchvision", "Pillow"]
    print(f"{'case':24} {'output':>10}" + "".join(f" {h:>13}" for h in head) + "  same")
    for name, (h, w), (oh, ow) in cases:
        image = rng.integers(0, 256, (h, w, 3), np.uint8)
        cells: list[tuple[float, float] | None] = []
        for backend in ("native", "numpy"):
            if backend not in BACKENDS:
                cells.append(None)
                continue
            call = functools.partial(resize, image, oh, ow, args.method, backend)
            cells.append(timed(call, args.repeats))
        same = "n/a"
        if tv is not None:
            prepare, run = tv
            chw = prepare(image)
            cells.append(timed(lambda: run(chw, oh, ow), args.repeats))  # noqa: B023
            want = run(chw, oh, ow)
            ours = [resize(image, oh, ow, args.method, b) for b in BACKENDS]
            same = "yes" if all(np.array_equal(o, want) for o in ours) else "NO"
        else:
            cells.append(None)
        pil_image = Image.fromarray(image)
        cells.append(timed(lambda: pil_image.resize((ow, oh), pil_filter), args.repeats))  # noqa: B023
        text = "".join(
            f" {'--':>13}" if c is None else f" {f'{c[0]:6.1f}/{c[1]:6.1f}':>13}" for c in cells
        )
        print(f"{name:24} {f'{ow}x{oh}':>10}{text}  {same}")


if __name__ == "__main__":
    main()
