"""Turn encoded image bytes into an RGB ``PIL.Image`` exactly as vLLM 0.32 does.

This reproduces ``ImageMediaIO.load_bytes`` (vllm/multimodal/media/image.py with the helpers in
vllm/multimodal/image.py) step for step, so the pixels we hand to the processor are exactly
those vLLM would have produced from the same bytes. Any deviation silently changes model
outputs, so it is pinned by tests that run vLLM's own function. On top of vLLM, only formats in
the policy's allow-list are parsed, and an image whose header declares too many pixels is
refused before any pixel data is decompressed.
"""

from __future__ import annotations

import contextlib
from io import BytesIO

from PIL import Image, ImageOps, UnidentifiedImageError

from multimodal.errors import MediaDecodeError, MediaError, MediaTooLargeError
from multimodal.policy import MediaPolicy

__all__ = ["decode_image", "decode_with_mime"]


def decode_image(data: bytes, policy: MediaPolicy) -> Image.Image:
    """Decode encoded bytes to an RGB image exactly as vLLM would. CPU-bound and blocking."""
    return decode_with_mime(data, policy)[0]


def decode_with_mime(data: bytes, policy: MediaPolicy) -> tuple[Image.Image, str | None]:
    """``decode_image`` plus the MIME type sniffed from the bytes (``None`` if Pillow has none)."""
    try:
        # Not used as a context manager: the file is an in-memory buffer, and the result may be
        # the opened image itself, which must stay usable.
        image = Image.open(BytesIO(data), formats=policy.allowed_formats)
        mime = image.get_format_mimetype()
        # Image.open only parsed the header; refuse before any pixel is decompressed.
        _check_pixel_count(image, policy.max_pixels)
        image = _apply_exif_orientation(image)
        image.load()
        return _to_rgb(image), mime
    except MediaError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        # Raised by Image.open itself when the header is far beyond Pillow's global limit (the
        # warning only arrives as an exception if the process escalates warnings to errors).
        raise MediaTooLargeError(f"image dimensions are too large: {exc}") from None
    except UnidentifiedImageError:
        formats = ", ".join(policy.allowed_formats)
        raise MediaDecodeError(f"not a supported image (accepted formats: {formats})") from None
    except Exception as exc:
        # Pillow reports corrupt input through many types (OSError, SyntaxError, ValueError,
        # EOFError, struct.error, ...); for untrusted bytes they all mean the same thing.
        raise MediaDecodeError(f"corrupt or truncated image: {exc}") from None


def _check_pixel_count(image: Image.Image, max_pixels: int) -> None:
    width, height = image.size
    if width * height > max_pixels:
        raise MediaTooLargeError(
            f"image is {width}x{height} ({width * height} pixels), more than the "
            f"{max_pixels} pixel limit"
        )


def _apply_exif_orientation(image: Image.Image) -> Image.Image:
    # vllm.multimodal.image.normalize_image: transpose by the EXIF Orientation tag, and keep the
    # untransposed image if that fails (broken EXIF must not reject an otherwise valid image).
    with contextlib.suppress(Exception):
        image = ImageOps.exif_transpose(image)
    return image


def _to_rgb(image: Image.Image) -> Image.Image:
    # vLLM ImageMediaIO._convert_image_mode + convert_image_mode with the default white
    # background: already-RGB images are returned untouched (a tRNS colour key on an RGB PNG is
    # ignored); anything with alpha or a transparency entry is composited onto white through
    # RGBA; everything else (L, P, CMYK, I;16, 1, ...) goes through Pillow's convert("RGB").
    if image.mode == "RGB":
        return image
    if image.mode != "RGBA" and (
        image.mode in ("LA", "PA") or "transparency" in getattr(image, "info", {})
    ):
        image = image.convert("RGBA")
    if image.mode == "RGBA":
        return _composite_on_white(image)
    return image.convert("RGB")


def _composite_on_white(image: Image.Image) -> Image.Image:
    # vllm.multimodal.image.rgba_to_rgb: paste with the alpha band as mask, not alpha_composite,
    # which rounds differently.
    converted = Image.new("RGB", image.size, (255, 255, 255))
    converted.paste(image, mask=image.split()[3])
    return converted
