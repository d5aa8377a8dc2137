"""The JPEG fast path (multimodal.decode.decode_pixels): libjpeg-turbo via simplejpeg straight
into an RGB array, checked pixel for pixel against vLLM's own ImageMediaIO.load_bytes, and every
input it must leave to Pillow's path. A broader set (odd sampling factors, arithmetic coding,
thousands of JPEGs): `python -m benchmarks.jpeg_fast_path_check`."""

from __future__ import annotations

import asyncio
import base64
import subprocess
import sys
from io import BytesIO

import numpy as np
import pytest
from PIL import ExifTags, Image

from multimodal import decode
from multimodal.decode import decode_image, decode_pixels
from multimodal.errors import MediaDecodeError, MediaTooLargeError
from multimodal.media import load_image
from multimodal.policy import MediaPolicy
from tests.support import IMAGES_DIR, ROOT

simplejpeg = pytest.importorskip("simplejpeg")

POLICY = MediaPolicy()
COMMITTED = sorted(IMAGES_DIR.glob("*.jpg"))
SUBSAMPLING = {0: "444", 1: "422", 2: "420"}


def noise(width: int, height: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def photo(width: int, height: int) -> np.ndarray:
    from tests.support.images.make import photo as make_photo

    return make_photo(width, height, seed=width + height)


def pillow_jpeg(pixels: np.ndarray | Image.Image, **options) -> bytes:
    image = pixels if isinstance(pixels, Image.Image) else Image.fromarray(pixels)
    buffer = BytesIO()
    image.save(buffer, "JPEG", **options)
    return buffer.getvalue()


def _generated() -> dict[str, tuple]:
    """name -> (picture, size, encoder options): encoded lazily in the test."""
    cases: dict[str, tuple] = {}
    for picture, size in (
        ("noise", (1, 1)),
        ("noise", (3, 7)),
        ("noise", (17, 33)),
        ("photo", (640, 480)),
    ):
        tag = f"{picture}-{size[0]}x{size[1]}"
        for quality in (50, 90, 100):
            for sub, name in SUBSAMPLING.items():
                for progressive in (False, True):
                    options = {"quality": quality, "subsampling": sub, "progressive": progressive}
                    kind = "progressive" if progressive else "baseline"
                    cases[f"{tag}-q{quality}-{name}-{kind}"] = (picture, size, options)
        cases[f"{tag}-optimized"] = (picture, size, {"quality": 90, "optimize": True})
        cases[f"{tag}-restart-blocks"] = (picture, size, {"restart_marker_blocks": 3})
        cases[f"{tag}-progressive-restart-rows"] = (
            picture,
            size,
            {"restart_marker_rows": 1, "progressive": True},
        )
        for sub in ("440", "411"):  # Pillow cannot write these; simplejpeg's encoder can
            cases[f"{tag}-{sub}"] = (picture, size, {"simplejpeg": sub})
    cases["photo-3840x2160-q90-420"] = ("photo", (3840, 2160), {"quality": 90})
    cases["photo-3840x2160-progressive"] = ("photo", (3840, 2160), {"progressive": True})
    return cases


GENERATED = _generated()


def encode_case(picture: str, size: tuple[int, int], options: dict) -> bytes:
    pixels = noise(*size) if picture == "noise" else photo(*size)
    if "simplejpeg" in options:
        return simplejpeg.encode_jpeg(pixels, quality=90, colorsubsampling=options["simplejpeg"])
    return pillow_jpeg(pixels, **options)


@pytest.fixture(scope="module")
def vllm_decode():
    module = pytest.importorskip("vllm.multimodal.media.image")
    media_io = module.ImageMediaIO()
    return lambda data: np.asarray(media_io.load_bytes(data).media)


def fast(data: bytes) -> np.ndarray:
    """decode_pixels, asserting it took the fast path."""
    decoded, mime = decode_pixels(data, POLICY)
    assert isinstance(decoded, np.ndarray), "expected the libjpeg-turbo path"
    assert mime == "image/jpeg"
    assert decoded.dtype == np.uint8 and decoded.flags.c_contiguous
    return decoded


def slow(data: bytes) -> Image.Image:
    """decode_pixels, asserting it left the bytes to Pillow."""
    decoded, _ = decode_pixels(data, POLICY)
    assert isinstance(decoded, Image.Image), "expected Pillow's path"
    assert decoded.mode == "RGB"
    return decoded


def same_outcome(vllm_decode, data: bytes) -> None:
    """decode_pixels gives vLLM's pixels, or fails where vLLM fails."""
    try:
        theirs = vllm_decode(data)
    except ValueError:
        with pytest.raises(MediaDecodeError):
            decode_pixels(data, POLICY)
        return
    assert np.array_equal(np.asarray(decode_pixels(data, POLICY)[0]), theirs)


# --------------------------------------------------------------------------------------------
# Same pixels as vLLM


@pytest.mark.parametrize("name", list(GENERATED))
def test_fast_path_matches_vllm(vllm_decode, name):
    data = encode_case(*GENERATED[name])
    ours = fast(data)
    theirs = vllm_decode(data)
    assert ours.shape == theirs.shape
    assert np.array_equal(ours, theirs)


@pytest.mark.parametrize("path", COMMITTED, ids=[p.stem for p in COMMITTED])
def test_committed_jpegs_match_vllm(vllm_decode, path):
    data = path.read_bytes()
    ours, _ = decode_pixels(data, POLICY)
    # EXIF-rotated and arithmetic-coded JPEGs take Pillow's path (see below).
    assert isinstance(ours, np.ndarray) == (path.stem not in ("exif_rotated", "arithmetic"))
    assert np.array_equal(np.asarray(ours), vllm_decode(data))


def test_orientation_1_keeps_the_fast_path(vllm_decode):
    exif = Image.Exif()
    exif[ExifTags.Base.Orientation] = 1
    data = pillow_jpeg(noise(40, 30, seed=3), exif=exif.tobytes())
    assert np.array_equal(fast(data), vllm_decode(data))


# --------------------------------------------------------------------------------------------
# Left to Pillow, with vLLM's result


def _exif(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[ExifTags.Base.Orientation] = orientation
    return pillow_jpeg(noise(40, 30, seed=4), exif=exif.tobytes())


def _with_segment(data: bytes, marker: int, payload: bytes) -> bytes:
    """A JPEG with one more marker segment right after SOI."""
    segment = bytes((0xFF, marker)) + (len(payload) + 2).to_bytes(2, "big") + payload
    return data[:2] + segment + data[2:]


def _rgb_component_ids() -> bytes:
    """No JFIF marker and components named R, G, B: libjpeg then reads the planes as RGB."""
    data = pillow_jpeg(noise(24, 16, seed=5), quality=90, subsampling=0)
    assert data[2:4] == b"\xff\xe0"  # Pillow's JFIF APP0 segment, dropped below
    data = data[:2] + data[4 + int.from_bytes(data[4:6], "big") :]
    sof, sos = data.index(b"\xff\xc0"), data.index(b"\xff\xda")
    out = bytearray(data)
    for offset, name in zip((sof + 10, sof + 13, sof + 16), b"RGB", strict=True):
        out[offset] = name
    for offset, name in zip((sos + 5, sos + 7, sos + 9), b"RGB", strict=True):
        out[offset] = name
    return bytes(out)


FALLBACKS = {
    "cmyk": lambda: pillow_jpeg(
        Image.fromarray(np.dstack([noise(40, 30, 1)] * 2)[:, :, :4], "CMYK")
    ),
    "grayscale": lambda: pillow_jpeg(Image.fromarray(noise(40, 30, 2)[:, :, 0])),
    "exif-rotate-90": lambda: _exif(6),
    "exif-rotate-180": lambda: _exif(3),
    "exif-mirror": lambda: _exif(2),
    "xmp-orientation": lambda: pillow_jpeg(
        noise(40, 30, 6), xmp=b'<x:xmpmeta><rdf:Description tiff:Orientation="8"/></x:xmpmeta>'
    ),
    "adobe-marker": lambda: _with_segment(
        pillow_jpeg(noise(40, 30, 7)), 0xEE, b"Adobe\x00\x64\x00\x00\x00\x00\x01"
    ),
    "rgb-colour-space": _rgb_component_ids,
    "arithmetic-frame-marker": lambda: pillow_jpeg(noise(40, 30, 8)).replace(
        b"\xff\xc0", b"\xff\xc9", 1
    ),
}


@pytest.mark.parametrize("name", list(FALLBACKS))
def test_fallbacks_keep_vllm_pixels(vllm_decode, name):
    data = FALLBACKS[name]()
    if name != "arithmetic-frame-marker":
        assert np.array_equal(np.asarray(slow(data)), vllm_decode(data))
    else:  # Huffman data under an arithmetic-coding marker: whatever vLLM makes of it
        assert not isinstance(decode_pixels(data, POLICY)[0], np.ndarray)
        same_outcome(vllm_decode, data)


def test_cmyk_case_is_really_cmyk():
    assert Image.open(BytesIO(FALLBACKS["cmyk"]())).mode == "CMYK"
    assert simplejpeg.decode_jpeg_header(_rgb_component_ids())[2] == "RGB"


def test_broken_exif_keeps_the_image_as_vllm_does(vllm_decode):
    data = _with_segment(pillow_jpeg(noise(40, 30, 9)), 0xE1, b"Exif\x00\x00MM\x00\x2a\xff\xff")
    same_outcome(vllm_decode, data)


def test_large_arithmetic_jpeg_matches_vllm(vllm_decode):
    # Pillow feeds libjpeg in blocks, which its arithmetic decoder cannot resume from: vLLM then
    # keeps a partly decoded image. Only Pillow's path reproduces that. Pillow cannot write
    # arithmetic coding: the image is committed (made by cjpeg, tests/support/images/make.py).
    data = (IMAGES_DIR / "arithmetic.jpg").read_bytes()
    assert len(data) > 64 * 1024  # more than one of Pillow's blocks
    slow(data)
    same_outcome(vllm_decode, data)


def test_truncated_jpeg_fails_as_before(vllm_decode):
    data = pillow_jpeg(photo(640, 480), quality=90)
    for cut in (len(data) // 2, len(data) - 2, 700):
        with pytest.raises(MediaDecodeError) as ours:
            decode_pixels(data[:cut], POLICY)
        with pytest.raises(MediaDecodeError) as before:
            decode_image(data[:cut], POLICY)
        assert str(ours.value) == str(before.value)
        same_outcome(vllm_decode, data[:cut])


def test_corrupt_entropy_data_matches_vllm(vllm_decode):
    data = bytearray(pillow_jpeg(photo(640, 480), quality=90))
    rng = np.random.default_rng(10)
    for _ in range(6):
        damaged = bytearray(data)
        for offset in rng.integers(len(data) // 3, len(data) - 10, 4):
            damaged[offset] ^= 0x5A
        same_outcome(vllm_decode, bytes(damaged))


class _NoDecoding:
    def decode_jpeg_header(self, *args, **kwargs):
        raise AssertionError("libjpeg-turbo must not see this image")

    decode_jpeg = decode_jpeg_header


def test_pixel_limit_checked_before_decoding(monkeypatch):
    monkeypatch.setattr(decode, "simplejpeg", _NoDecoding())
    data = pillow_jpeg(noise(64, 48, seed=11))
    with pytest.raises(MediaTooLargeError) as ours:
        decode_pixels(data, MediaPolicy(max_pixels=64 * 48 - 1))
    with pytest.raises(MediaTooLargeError) as before:
        decode_image(data, MediaPolicy(max_pixels=64 * 48 - 1))
    assert str(ours.value) == str(before.value)


# --------------------------------------------------------------------------------------------
# Without the fast path


def test_forced_fallback_gives_the_same_pixels(monkeypatch):
    data = pillow_jpeg(photo(640, 480), quality=90)
    fast_pixels = fast(data)
    monkeypatch.setattr(decode, "FAST_JPEG", False)
    assert np.array_equal(np.asarray(slow(data)), fast_pixels)


def test_a_failing_simplejpeg_falls_back(monkeypatch):
    data = pillow_jpeg(photo(64, 48), quality=90)
    expected = fast(data)

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(simplejpeg, "decode_jpeg", broken)
    assert np.array_equal(np.asarray(slow(data)), expected)


@pytest.mark.slow  # a subprocess: a fresh interpreter without simplejpeg
def test_without_simplejpeg_installed():
    script = (
        "import sys; sys.modules['simplejpeg'] = None\n"
        "from io import BytesIO\n"
        "from PIL import Image\n"
        "from multimodal import decode\n"
        "from multimodal.policy import MediaPolicy\n"
        "buffer = BytesIO(); Image.new('RGB', (8, 8), (9, 99, 199)).save(buffer, 'JPEG')\n"
        "image, mime = decode.decode_pixels(buffer.getvalue(), MediaPolicy())\n"
        "assert not decode.FAST_JPEG and isinstance(image, Image.Image), image\n"
        "print(mime, image.size)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "image/jpeg (8, 8)"


# --------------------------------------------------------------------------------------------
# Through the loader


def test_loaded_image_carries_the_array_without_a_copy():
    data = pillow_jpeg(photo(64, 48), quality=90)
    uri = "data:image/jpeg;base64," + base64.b64encode(data).decode()
    loaded = asyncio.run(load_image(uri, POLICY))
    assert isinstance(loaded.decoded, np.ndarray)
    assert loaded.pixels is loaded.decoded
    assert loaded.mime == "image/jpeg" and loaded.data == data
    assert loaded.image.mode == "RGB" and loaded.image.size == (64, 48)
    assert np.array_equal(np.asarray(loaded.image), np.asarray(decode_image(data, POLICY)))


def test_loaded_png_stays_a_pil_image():
    buffer = BytesIO()
    Image.fromarray(photo(24, 16)).save(buffer, "PNG")
    uri = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    loaded = asyncio.run(load_image(uri, POLICY))
    assert isinstance(loaded.decoded, Image.Image)
    assert np.array_equal(loaded.pixels, np.asarray(loaded.image))
