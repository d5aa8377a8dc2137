"""Turn encoded image bytes into an RGB ``PIL.Image`` exactly as vLLM 0.32 does.

This reproduces ``ImageMediaIO.load_bytes`` (vllm/multimodal/media/image.py with the helpers in
vllm/multimodal/image.py) step for step, so the pixels we hand to the processor are exactly
those vLLM would have produced from the same bytes. Any deviation silently changes model
outputs, so it is pinned by tests that run vLLM's own function. On top of vLLM, only formats in
the policy's allow-list are parsed, and an image whose header declares too many pixels is
refused before any pixel data is decompressed.

``decode_pixels`` is the same decode for the pipeline: 8-bit YCbCr JPEGs without an EXIF
rotation are decoded by libjpeg-turbo (``simplejpeg``) straight into an RGB array, with the same
settings as Pillow's (accurate integer IDCT, smooth upsampling), which skips Pillow's 4-byte
pixel buffer and the copy into numpy. Pillow still parses the header (MIME type, pixel limit,
EXIF), and everything else, or anything libjpeg warns about, takes Pillow's path, so bad input
fails exactly as in vLLM. Without ``simplejpeg`` installed, everything takes Pillow's path.
"""

from __future__ import annotations

import contextlib
from io import BytesIO
from typing import cast

import numpy as np
from PIL import ExifTags, Image, ImageOps, UnidentifiedImageError

from multimodal.errors import MediaDecodeError, MediaError, MediaTooLargeError
from multimodal.policy import MediaPolicy

try:
    import simplejpeg
except ImportError:  # optional at run time: Pillow gives the same pixels, only slower
    simplejpeg = None

__all__ = ["check_header", "decode_image", "decode_pixels", "decode_with_mime"]

# Whether decode_pixels may take the libjpeg-turbo path (tests turn it off to force Pillow's).
FAST_JPEG = simplejpeg is not None
# The EXIF orientations ImageOps.exif_transpose acts on; any other value (or none) is a no-op.
_TRANSPOSING = frozenset(range(2, 9))
# Huffman-coded frames: baseline, extended sequential, progressive. Not arithmetic coding: its
# decoder cannot resume on more data, so Pillow (which feeds libjpeg in blocks) fails on larger
# arithmetic-coded images where vLLM then keeps a partly decoded one.
_HUFFMAN_FRAMES = frozenset((0xC0, 0xC1, 0xC2))


def decode_image(data: bytes, policy: MediaPolicy) -> Image.Image:
    """Decode encoded bytes to an RGB image exactly as vLLM would. CPU-bound and blocking."""
    return decode_with_mime(data, policy)[0]


def decode_with_mime(data: bytes, policy: MediaPolicy) -> tuple[Image.Image, str | None]:
    """``decode_image`` plus the MIME type sniffed from the bytes (``None`` if Pillow has none)."""
    decoded, mime = _decode(data, policy, fast=False)
    return cast(Image.Image, decoded), mime


def decode_pixels(data: bytes, policy: MediaPolicy) -> tuple[Image.Image | np.ndarray, str | None]:
    """``decode_with_mime``, or for plain JPEGs the same pixels as an HxWx3 uint8 array.

    ``np.asarray`` of the result is always what ``np.asarray(decode_image(data))`` gives.
    """
    return _decode(data, policy, fast=FAST_JPEG)


def check_header(data: bytes, policy: MediaPolicy) -> str:
    """The MIME type of an image whose header passes the policy (an allowed format, not too
    many pixels), raising as ``decode_image`` would; no pixel is decompressed."""
    return _decode(data, policy, fast=False, header_only=True)[1] or "application/octet-stream"


def _decode(
    data: bytes, policy: MediaPolicy, fast: bool, header_only: bool = False
) -> tuple[Image.Image | np.ndarray, str | None]:
    try:
        # Not used as a context manager: the file is an in-memory buffer, and the result may be
        # the opened image itself, which must stay usable.
        image = Image.open(BytesIO(data), formats=policy.allowed_formats)
        mime = image.get_format_mimetype()
        # Image.open only parsed the header; refuse before any pixel is decompressed.
        _check_pixel_count(image, policy.max_pixels)
        if header_only:
            return image, mime
        pixels = _fast_jpeg(image, data) if fast else None
        if pixels is not None:
            return pixels, mime
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
    # exif_transpose loads the image, reads the tag and, when there is nothing to do, returns a
    # full copy; the same steps without that copy. A failed first load is swallowed as in vLLM
    # (the caller's load() then decides, as vLLM's second load() does).
    with contextlib.suppress(Exception):
        image.load()
        if _orientation(image) in _TRANSPOSING:
            image = ImageOps.exif_transpose(image)
    return image


def _orientation(image: Image.Image) -> object:
    # What exif_transpose reads: the EXIF tag, else an XMP tiff:Orientation, else 1.
    return image.getexif().get(ExifTags.Base.Orientation, 1)


def _fast_jpeg(image: Image.Image, data: bytes) -> np.ndarray | None:
    """The decoded RGB pixels by libjpeg-turbo, or None where only Pillow's path is known equal.

    Only 8-bit, 3-component YCbCr JPEGs (not MPO, no Adobe marker) whose EXIF orientation needs
    no transpose; libjpeg's warnings are errors here (``strict``), so damaged data goes to
    Pillow, which decides what vLLM would do with it.
    """
    if image.format != "JPEG" or image.mode != "RGB" or "adobe" in image.info:
        return None
    if _frame_marker(data) not in _HUFFMAN_FRAMES:
        return None
    try:
        if _orientation(image) in _TRANSPOSING:
            return None
        if simplejpeg.decode_jpeg_header(data, strict=True)[2] != "YCbCr":
            return None
        pixels = simplejpeg.decode_jpeg(
            data, colorspace="RGB", fastdct=False, fastupsample=False, strict=True
        )
    except Exception:
        return None
    return pixels if pixels.shape == (image.height, image.width, 3) else None


def _frame_marker(data: bytes) -> int | None:
    """The JPEG's start-of-frame marker (0xC0-0xCF), or None if not found in well-formed segments
    before the first scan."""
    pos, end = 2, len(data)
    while pos + 4 <= end and data[pos] == 0xFF:
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
        elif 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # DHT, JPG, DAC
            return marker
        elif marker in (0x01, 0xD9, 0xDA) or 0xD0 <= marker <= 0xD8:
            return None  # a scan, the end, or a marker without length: none is a plain header
        else:
            pos += 2 + int.from_bytes(data[pos + 2 : pos + 4], "big")
    return None


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
