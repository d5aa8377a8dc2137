"""Check the JPEG fast path against vLLM's decode over a broad set of generated JPEGs.

    python -m benchmarks.jpeg_fast_path_check [--quick]

Encodes photo-like and noise images of many sizes with Pillow (quality 50/90/100, 4:4:4, 4:2:2,
4:2:0, progressive, optimized Huffman tables, restart intervals), with simplejpeg (4:4:0, 4:1:1)
and, when libjpeg-turbo's ``cjpeg`` is on PATH, with cjpeg (odd sampling factors, arithmetic
coding, RGB colour space, float DCT), adds the JPEGs under tests/support/images, and compares
``multimodal.decode.decode_pixels`` with vLLM's ``ImageMediaIO().load_bytes`` on each: same
pixels (or both failing). Prints how many took the fast path and every difference; exits 1 on
any. The tests run a smaller set (tests/unit/multimodal/test_jpeg_fast_path.py).
"""

from __future__ import annotations

import argparse
import io
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from PIL import Image, ImageFile

from benchmarks.preprocess_bench import photo_like
from multimodal.decode import decode_pixels
from multimodal.errors import MediaError
from multimodal.policy import MediaPolicy

SIZES = ((1, 1), (3, 7), (7, 3), (17, 33), (33, 17), (64, 48), (640, 480), (1280, 960))
LARGE = ((1281, 961), (3840, 2160))
CJPEG_SAMPLING = ("1x1", "2x1", "1x2", "2x2", "4x1", "1x4", "4x2", "3x1", "3x2", "2x4")
CJPEG_OPTIONS = (
    (),
    ("-arithmetic",),
    ("-progressive",),
    ("-progressive", "-arithmetic"),
    ("-restart", "1"),
    ("-rgb",),
    ("-dct", "float"),
    ("-quality", "100"),
)
POLICY = MediaPolicy()


def pictures(sizes) -> Iterator[tuple[str, np.ndarray]]:
    for width, height in sizes:
        rng = np.random.default_rng(width * 10007 + height)
        yield f"noise {width}x{height}", rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        if width * height > 100:
            yield f"photo {width}x{height}", np.asarray(photo_like(width, height))


def pillow_jpeg(pixels: np.ndarray, **options) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", **options)
    return buffer.getvalue()


def pillow_cases(name: str, pixels: np.ndarray, quick: bool) -> Iterator[tuple[str, bytes]]:
    large = pixels.shape[0] * pixels.shape[1] > 2_000_000
    for quality in (90,) if quick or large else (50, 90, 100):
        for sub in (0, 1, 2):
            for progressive in (False, True):
                for optimize in (False,) if large else (False, True):
                    yield (
                        f"pillow {name} q{quality} {('4:4:4', '4:2:2', '4:2:0')[sub]}"
                        f"{' progressive' if progressive else ''}{' optimize' if optimize else ''}",
                        pillow_jpeg(
                            pixels,
                            quality=quality,
                            subsampling=sub,
                            progressive=progressive,
                            optimize=optimize,
                        ),
                    )
        yield (
            f"pillow {name} q{quality} restart/3 blocks",
            pillow_jpeg(pixels, quality=quality, restart_marker_blocks=3),
        )
        yield (
            f"pillow {name} q{quality} progressive restart/row",
            pillow_jpeg(pixels, quality=quality, restart_marker_rows=1, progressive=True),
        )


def simplejpeg_cases(name: str, pixels: np.ndarray) -> Iterator[tuple[str, bytes]]:
    import simplejpeg

    contiguous = np.ascontiguousarray(pixels)
    for sub in ("444", "422", "420", "440", "411"):
        data = simplejpeg.encode_jpeg(contiguous, quality=90, colorsubsampling=sub)
        yield f"simplejpeg {name} {sub}", data


def cjpeg_cases(name: str, pixels: np.ndarray, folder: Path) -> Iterator[tuple[str, bytes]]:
    source, out = folder / "in.ppm", folder / "out.jpg"
    Image.fromarray(pixels).save(source)
    for sampling in CJPEG_SAMPLING:
        for options in CJPEG_OPTIONS:
            command = ["cjpeg", "-sample", sampling, *options, "-outfile", str(out), str(source)]
            if subprocess.run(command, capture_output=True).returncode == 0:
                yield f"cjpeg {name} {sampling} {' '.join(options)}", out.read_bytes()


def committed() -> Iterator[tuple[str, bytes]]:
    for path in sorted(
        (Path(__file__).parent.parent / "tests" / "support" / "images").glob("*.jp*g")
    ):
        yield f"tests/support/images/{path.name}", path.read_bytes()


def all_cases(quick: bool) -> Iterator[tuple[str, bytes]]:
    ImageFile.MAXBLOCK = 1 << 27  # Pillow's optimize/progressive encoder needs it for noise
    sizes = SIZES[::2] if quick else SIZES + LARGE
    folder = Path(tempfile.mkdtemp())
    try:
        for name, pixels in pictures(sizes):
            yield from pillow_cases(name, pixels, quick)
            yield from simplejpeg_cases(name, pixels)
            if shutil.which("cjpeg") and pixels.shape[0] * pixels.shape[1] < 2_000_000:
                yield from cjpeg_cases(name, pixels, folder)
    finally:
        shutil.rmtree(folder)
    yield from committed()


def compare(load, data: bytes) -> tuple[str, bool]:
    """("fast" | "pillow" | "both fail", same)."""
    try:
        theirs = np.asarray(load(data))
    except ValueError:  # vLLM's error for undecodable bytes
        theirs = None
    try:
        ours = decode_pixels(data, POLICY)[0]
    except MediaError:
        return "both fail" if theirs is None else "ours fails", theirs is None
    path = "fast" if isinstance(ours, np.ndarray) else "pillow"
    return path, theirs is not None and np.array_equal(np.asarray(ours), theirs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes and qualities")
    args = parser.parse_args()
    from vllm.multimodal.media import ImageMediaIO

    media_io = ImageMediaIO()
    counts: dict[str, int] = {}
    differ = []
    for name, data in all_cases(args.quick):
        path, same = compare(lambda d: media_io.load_bytes(d).media, data)
        counts[path] = counts.get(path, 0) + 1
        if not same:
            differ.append(name)
            print(f"DIFFERS ({path}): {name}", flush=True)
    total = sum(counts.values())
    print(f"{total} JPEGs: {counts}; cjpeg {'used' if shutil.which('cjpeg') else 'not found'}")
    print(f"{len(differ)} differ from vLLM's decode")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
