"""Where the time of our Qwen2.5-VL path goes, step by step, for one image size.

    python -m benchmarks.qwen_steps_bench [--size 1280x960] [--repeats 21]

Times, single-threaded and interleaved (median and min of the rounds): the JPEG decode (the
gateway's ``decode_pixels``: libjpeg-turbo straight into an RGB array, and Pillow's path as
vLLM decodes, with the PIL-to-numpy copy after it), the whole of bytes to patches through the
gateway's path (decode_pixels + processor, uint8 and float32), the native resize passes alone
(width only, height only, both), the native resize fused with the patch layout (uint8 and
normalized float32, what the processor runs), and for comparison numpy's resize and _patchify
(the fallback).  Outputs are preallocated where the API allows, so page faults of fresh output
arrays show only in the processor rows.
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import statistics  # noqa: E402
from collections.abc import Callable  # noqa: E402

import numpy as np  # noqa: E402

from benchmarks.preprocess_bench import (  # noqa: E402
    POLICY,
    QWEN25_PREPROCESSOR,
    encode,
    interleaved,
    load_average,
    photo_like,
)
from multimodal import decode, native  # noqa: E402
from multimodal.decode import decode_image, decode_pixels  # noqa: E402
from multimodal.processors.qwen_vl import QwenVLProcessor, QwenVLSettings, smart_resize  # noqa: E402
from multimodal.resize import resize  # noqa: E402


def qwen25() -> QwenVLProcessor:
    pre = QWEN25_PREPROCESSOR
    settings = QwenVLSettings(
        patch_size=pre["patch_size"],
        merge_size=pre["merge_size"],
        temporal_patch_size=pre["temporal_patch_size"],
        min_pixels=pre["min_pixels"],
        max_pixels=pre["max_pixels"],
        mean=tuple(pre["image_mean"]),
        std=tuple(pre["image_std"]),
        rescale_factor=1 / 255,
        image_token_id=0,
    )
    return QwenVLProcessor(settings)


def steps(width: int, height: int) -> dict[str, Callable[[], object]]:
    from multimodal import _kernels

    data = encode(photo_like(width, height), "JPEG")
    image = np.asarray(decode_image(data, POLICY))
    processor = qwen25()
    s = processor.settings
    out_h, out_w = smart_resize(height, width, 28, s.min_pixels, s.max_pixels)
    h_axis = native.axis_argument(width, out_w, "bicubic")
    v_axis = native.axis_argument(height, out_h, "bicubic")
    wide = np.empty((height, out_w, 3), np.uint8)
    tall = np.empty((out_h, width, 3), np.uint8)
    both = np.empty((out_h, out_w, 3), np.uint8)
    resized = resize(image, out_h, out_w)
    pil = decode_image(data, POLICY)
    assert isinstance(decode_pixels(data, POLICY)[0], np.ndarray) == decode.FAST_JPEG

    def bytes_to_patches(raw: bool) -> object:
        return processor.process(
            [np.asarray(decode_pixels(data, POLICY)[0])], processor.resolve({}), raw
        )

    return {
        "decode (JPEG), decode_pixels": lambda: decode_pixels(data, POLICY),
        "decode (JPEG), Pillow (decode_image)": lambda: decode_image(data, POLICY),
        "np.asarray(PIL image)": lambda: np.asarray(pil),
        "bytes -> u8 patches (decode_pixels + proc)": lambda: bytes_to_patches(True),
        "bytes -> f32 patches (decode_pixels + proc)": lambda: bytes_to_patches(False),
        "native width pass only": lambda: _kernels.resize(
            image, height, width, 3, wide, height, out_w, h_axis, None
        ),
        "native height pass only": lambda: _kernels.resize(
            image, height, width, 3, tall, out_h, width, None, v_axis
        ),
        "native resize (both passes)": lambda: _kernels.resize(
            image, height, width, 3, both, out_h, out_w, h_axis, v_axis
        ),
        "native processor u8 (resize + patches)": lambda: processor.process(
            [image], processor.resolve({}), True
        ),
        "native processor f32 (+ normalize)": lambda: processor.process(
            [image], processor.resolve({}), False
        ),
        "numpy resize": lambda: resize(image, out_h, out_w, backend="numpy"),
        "numpy _patchify u8": lambda: processor._patchify(resized, True),
        "numpy _patchify f32": lambda: processor._patchify(resized, False),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1280x960", help="WIDTHxHEIGHT")
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()
    if not native.AVAILABLE:
        raise SystemExit("the native kernels are not built: pip install -e .")
    width, height = (int(v) for v in args.size.split("x"))
    fns = steps(width, height)
    for fn in fns.values():  # warm-up: weight tables, allocator
        fn()
    runs = interleaved(fns, args.repeats)
    print(
        f"{width}x{height}, kernels {native.simd_level()}, JPEG fast path {decode.FAST_JPEG}, "
        f"load average {load_average()}"
    )
    print(f"ms, median / min of {args.repeats} interleaved rounds")
    for name, times in runs.items():
        print(f"{name:40} {statistics.median(times):7.2f} / {min(times):6.2f}")


if __name__ == "__main__":
    main()
