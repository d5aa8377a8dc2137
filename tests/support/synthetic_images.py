"""In-memory test images of the shapes every processor must handle (same pixels every run)."""

from __future__ import annotations

import numpy as np
from PIL import Image


def image(width: int, height: int, seed: int, mode: str = "RGB") -> Image.Image:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    ramp = np.linspace(0, 255, width, dtype=np.float32)[None, :, None]
    pixels = ((base.astype(np.float32) + ramp) / 2).astype(np.uint8)
    return Image.fromarray(pixels, "RGB").convert(mode).convert("RGB")


IMAGES = {
    "square": image(300, 300, 1),
    "tall": image(90, 400, 2),
    "wide": image(500, 120, 3),
    "very thin": image(600, 8, 4),
    "tiny": image(10, 12, 5),
    "large": image(1280, 960, 6),
    "odd": image(333, 177, 7),
    "grayscale": image(200, 150, 8, "L"),
}
