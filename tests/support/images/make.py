"""Regenerates the committed parity images (deterministic):
`python -m tests.support.images.make`."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

HERE = Path(__file__).resolve().parent


def photo(width: int, height: int, seed: int) -> np.ndarray:
    """Smooth gradients, noise and a hard edge: what resizing and codecs find in photos."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    r = 127 + 120 * np.sin(x / max(width, 1) * 6.0)
    g = 127 + 120 * np.cos(y / max(height, 1) * 5.0)
    b = (x + y) / max(width + height, 1) * 255
    rgb = np.stack([r, g, b], axis=-1) + rng.normal(0, 12, (height, width, 3))
    rgb[:, width // 2 :, 0] = 255 - rgb[:, width // 2 :, 0]
    return np.clip(rgb, 0, 255).astype(np.uint8)


def main() -> None:
    Image.fromarray(photo(256, 256, 1)).save(HERE / "square.jpg", quality=90)
    Image.fromarray(photo(120, 400, 2)).save(HERE / "tall.png")
    Image.fromarray(photo(500, 120, 3)).save(HERE / "wide.jpg", quality=90)
    Image.fromarray(photo(600, 6, 4)).save(HERE / "very_thin.png")
    Image.fromarray(photo(10, 12, 5)).save(HERE / "tiny.png")
    Image.fromarray(photo(1280, 960, 6)).save(HERE / "large.jpg", quality=70)
    Image.fromarray(photo(333, 177, 7)).save(HERE / "odd.jpg", quality=90)
    Image.fromarray(photo(200, 150, 8)).convert("L").save(HERE / "grayscale.png")
    rgba = np.dstack([photo(160, 120, 9), np.tile(np.linspace(0, 255, 160), (120, 1))])
    Image.fromarray(rgba.astype(np.uint8), "RGBA").save(HERE / "rgba.png")
    palette = Image.fromarray(photo(150, 100, 10)).quantize(colors=32)
    palette.save(HERE / "palette.png", transparency=0)
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise to display
    Image.fromarray(photo(200, 100, 11)).save(HERE / "exif_rotated.jpg", quality=90, exif=exif)
    arithmetic_jpeg(photo(1281, 961, 12), HERE / "arithmetic.jpg")


def arithmetic_jpeg(pixels: np.ndarray, out: Path) -> None:
    """Arithmetic-coded, which Pillow cannot write: libjpeg-turbo's cjpeg (Debian package
    libjpeg-turbo-progs) encodes it. Large enough that Pillow decodes it in several blocks."""
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "in.ppm"
        Image.fromarray(pixels).save(source)
        subprocess.run(["cjpeg", "-arithmetic", "-outfile", str(out), str(source)], check=True)


if __name__ == "__main__":
    main()
