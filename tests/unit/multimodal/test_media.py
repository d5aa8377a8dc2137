"""multimodal.media: sources, operator policy and vLLM-identical decoding.

HTTP behaviour is exercised against a real HTTP server on 127.0.0.1; all images are generated
here with Pillow. The decode tests compare against vLLM's own ImageMediaIO on the same bytes.
"""

from __future__ import annotations

import asyncio
import base64
import os
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import BytesIO
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pytest
from PIL import ExifTags, Image

from multimodal.decode import decode_pixels, decode_with_mime
from multimodal.errors import (
    MediaDecodeError,
    MediaError,
    MediaFetchError,
    MediaForbiddenError,
    MediaSourceError,
    MediaTimeoutError,
    MediaTooLargeError,
)
from multimodal.media import (
    LoadedImage,
    MediaPolicy,
    create_http_client,
    decode_image,
    decode_sources,
    download_all,
    load_image,
    load_images,
)
from multimodal.net_guard import _refusal

# --------------------------------------------------------------------------------------------
# Test images (generated, never committed)


def _noise(height: int, width: int, channels: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, channels), dtype=np.uint8)


def _encode(image: Image.Image, fmt: str, **params) -> bytes:
    buf = BytesIO()
    image.save(buf, fmt, **params)
    return buf.getvalue()


def _raw(mode: str, size: tuple[int, int], channels: int, seed: int) -> Image.Image:
    return Image.frombytes(mode, size, _noise(size[1], size[0], channels, seed).tobytes())


def _rgba_with_holes() -> Image.Image:
    pixels = _noise(32, 48, 4, seed=3)
    pixels[:8, :, 3] = 0  # fully transparent band: must come out white
    pixels[8:16, :, 3] = 128  # half transparent: exercises the paste rounding
    return Image.frombytes("RGBA", (48, 32), pixels.tobytes())


def _palette(transparent: bool) -> bytes:
    image = _raw("RGB", (40, 30), 3, seed=4).quantize(colors=32)
    return _encode(image, "PNG", **({"transparency": 0} if transparent else {}))


def _exif_jpeg(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[ExifTags.Base.Orientation] = orientation
    return _encode(_raw("RGB", (64, 40), 3, seed=5), "JPEG", quality=90, exif=exif.tobytes())


def _gif() -> bytes:
    frames = [_raw("RGB", (32, 24), 3, seed=s).quantize(colors=16) for s in (6, 7)]
    return _encode(
        frames[0], "GIF", save_all=True, append_images=frames[1:], transparency=0, duration=50
    )


def _png_declaring(width: int, height: int) -> bytes:
    # A valid PNG header claiming a huge 8-bit grayscale image, with a single row of data: any
    # attempt to decode it would fail as truncated, so TooLarge proves the refusal came first.
    def chunk(tag: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(tag + body)
        return struct.pack(">I", len(body)) + tag + body + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    compressor = zlib.compressobj()
    # Flushed but not finished: the zlib stream is cut off after the first row.
    row = compressor.compress(b"\x00" * (width + 1)) + compressor.flush(zlib.Z_SYNC_FLUSH)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", row) + chunk(b"IEND", b"")


PNG = _encode(_raw("RGB", (24, 16), 3, seed=1), "PNG")
JPEG = _encode(_raw("RGB", (64, 48), 3, seed=2), "JPEG", quality=90)

DECODE_CASES: dict[str, bytes] = {
    "rgb_jpeg": JPEG,
    "gray_png": _encode(_raw("L", (40, 30), 1, seed=8), "PNG"),
    "rgba_png": _encode(_rgba_with_holes(), "PNG"),
    "palette_png": _palette(transparent=False),
    "palette_png_transparent": _palette(transparent=True),
    "cmyk_jpeg": _encode(_raw("CMYK", (40, 30), 4, seed=9), "JPEG", quality=90),
    "la_png": _encode(_raw("LA", (40, 30), 2, seed=10), "PNG"),
    "exif_rotate_90_jpeg": _exif_jpeg(6),
    "exif_rotate_180_jpeg": _exif_jpeg(3),
    "gif_first_frame": _gif(),
    "bmp": _encode(_raw("RGB", (33, 17), 3, seed=11), "BMP"),
    "webp_lossy": _encode(_raw("RGB", (40, 30), 3, seed=12), "WEBP", quality=80),
    "webp_lossless_rgba": _encode(_rgba_with_holes(), "WEBP", lossless=True),
    "rgb_png_colour_key": _encode(_raw("RGB", (20, 10), 3, seed=13), "PNG", transparency=(0, 0, 0)),
    "bilevel_png": _encode(_raw("L", (40, 30), 1, seed=14).convert("1"), "PNG"),
    "i16_png": _encode(_raw("I;16", (20, 10), 2, seed=15), "PNG"),
}


def _data_uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def run(coro):
    return asyncio.run(coro)


# --------------------------------------------------------------------------------------------
# A real HTTP server on 127.0.0.1


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def _send(self, status: int, body: bytes, content_type: str = "image/png") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _redirect(self, location: str) -> None:
        self.send_response(302)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _stream_forever(self, chunked: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Connection", "close")  # body ends when the connection does
        self.end_headers()
        block = b"\x00" * 16384
        deadline = time.monotonic() + 10  # never outlive the test session for long
        try:
            while time.monotonic() < deadline:
                if chunked:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(block), block))
                else:
                    self.wfile.write(block)
        except OSError:
            pass  # the client hung up, which is the point
        self.close_connection = True

    def do_GET(self) -> None:  # noqa: C901 - a routing table
        url = urlsplit(self.path)
        path = url.path
        if path == "/image.png":
            self._send(200, PNG)
        elif path.startswith("/r/"):
            hops = int(path[3:])
            self._redirect("/image.png" if hops == 0 else f"/r/{hops - 1}")
        elif path == "/to":
            self._redirect(parse_qs(url.query)["url"][0])
        elif path == "/endless-chunked":
            self._stream_forever(chunked=True)
        elif path == "/endless-close":
            self._stream_forever(chunked=False)
        elif path == "/declares-huge":
            self.send_response(200)
            self.send_header("Content-Length", str(500 * 1024 * 1024))
            self.end_headers()
            self.close_connection = True
        elif path == "/slow":
            time.sleep(1.5)
            self._send(200, PNG)
        elif path == "/drip":
            self.send_response(200)
            self.send_header("Content-Length", str(len(PNG)))
            self.end_headers()
            try:
                for byte in PNG:
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(0.05)
            except OSError:
                pass
        elif path == "/text":
            self._send(200, b"<html>not an image</html>", "text/html")
        else:
            self._send(404, b"missing", "text/plain")


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


# The operator trusts exactly the test server's address.
LOCAL = MediaPolicy(
    allowed_networks=("127.0.0.1/32",), connect_timeout=2, read_timeout=2, total_timeout=5
)


# --------------------------------------------------------------------------------------------
# HTTP sources


def test_http_image_loads_when_operator_allows_loopback(server):
    loaded = run(load_image(f"{server}/image.png", LOCAL))
    assert isinstance(loaded, LoadedImage)
    assert loaded.data == PNG
    assert loaded.source_kind == "http"
    assert loaded.mime == "image/png"
    assert loaded.image.mode == "RGB" and loaded.image.size == (24, 16)


def test_loopback_refused_by_default(server):
    for url in (f"{server}/image.png", server.replace("127.0.0.1", "localhost") + "/image.png"):
        with pytest.raises(MediaForbiddenError, match="loopback"):
            run(load_image(url, MediaPolicy()))


@pytest.mark.parametrize(
    ("host", "category"),
    [
        ("10.1.2.3", "private"),
        ("192.168.0.10", "private"),
        ("172.16.5.4", "private"),
        ("100.64.0.1", "non-public"),  # CGNAT
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("240.0.0.1", "reserved"),
        ("169.254.1.1", "link-local"),
        ("169.254.169.254", "cloud metadata"),
        ("[fd00:ec2::254]", "cloud metadata"),
        ("[::1]", "loopback"),
        ("[fe80::1]", "link-local"),
        ("[fc00::1]", "private"),
        ("[::ffff:127.0.0.1]", "loopback"),  # IPv4-mapped
        ("[2002:a00:1::]", "private"),  # 6to4 wrapping 10.0.0.1
        ("[64:ff9b::a9fe:a9fe]", "cloud metadata"),  # NAT64 wrapping 169.254.169.254
    ],
)
def test_non_public_addresses_refused_before_connecting(host, category):
    with pytest.raises(MediaForbiddenError, match=category):
        run(load_image(f"http://{host}/x.png", MediaPolicy()))


def test_address_policy_allows_public_and_operator_networks():
    import ipaddress

    public = [ipaddress.ip_address(a) for a in ("8.8.8.8", "2606:4700::1111", "::ffff:1.1.1.1")]
    assert all(_refusal(ip, MediaPolicy()) is None for ip in public)
    trusting = MediaPolicy(allowed_networks=("10.0.0.0/8", "169.254.0.0/16"))
    assert _refusal(ipaddress.ip_address("10.9.8.7"), trusting) is None
    assert _refusal(ipaddress.ip_address("169.254.1.1"), trusting) is None
    # A broad range does not expose the credential endpoint; an explicit /32 does.
    assert _refusal(ipaddress.ip_address("169.254.169.254"), trusting) == "cloud metadata"
    explicit = MediaPolicy(allowed_networks=("169.254.169.254/32",))
    assert _refusal(ipaddress.ip_address("169.254.169.254"), explicit) is None


def test_guarded_client_enforces_policy_at_connect_time(server):
    # The check inside the client's network backend is what closes the DNS-rebinding window;
    # it must hold even when the pre-request check is bypassed entirely.
    async def fetch(policy: MediaPolicy) -> int:
        async with create_http_client(policy) as client:
            return (await client.get(f"{server}/image.png")).status_code

    with pytest.raises(MediaForbiddenError, match="loopback"):
        run(fetch(MediaPolicy()))
    assert run(fetch(LOCAL)) == 200


def test_redirect_chain_within_limit(server):
    loaded = run(load_image(f"{server}/r/2", LOCAL))  # 3 redirects, the default maximum
    assert loaded.data == PNG
    with pytest.raises(MediaFetchError, match="more than 3 redirects"):
        run(load_image(f"{server}/r/3", LOCAL))
    with pytest.raises(MediaFetchError, match="more than 0 redirects"):
        run(
            load_image(
                f"{server}/r/0", MediaPolicy(allowed_networks=("127.0.0.1/32",), max_redirects=0)
            )
        )


@pytest.mark.parametrize(
    ("target", "match"),
    [
        ("http://127.0.0.2:{port}/image.png", "loopback"),  # loopback beyond the allowed /32
        ("http://[::1]:{port}/image.png", "loopback"),
        ("http://169.254.169.254/latest/meta-data/", "cloud metadata"),
        ("file:///etc/passwd", "non-HTTP"),
    ],
)
def test_redirect_to_forbidden_target_refused(server, target, match):
    port = server.rsplit(":", 1)[1]
    url = f"{server}/to?url={target.format(port=port)}"
    # Even a broad link-local allowance does not open the metadata endpoint.
    policy = MediaPolicy(allowed_networks=("127.0.0.1/32", "169.254.0.0/16"))
    with pytest.raises(MediaForbiddenError, match=match):
        run(load_image(url, policy))


def test_domain_allow_list(server):
    trusted = MediaPolicy(allowed_networks=("127.0.0.1/32",), allowed_domains=("127.0.0.1",))
    assert run(load_image(f"{server}/image.png", trusted)).data == PNG
    other = MediaPolicy(allowed_networks=("127.0.0.1/32",), allowed_domains=("images.example",))
    with pytest.raises(MediaForbiddenError, match="allowed media domains"):
        run(load_image(f"{server}/image.png", other))
    # Every hop is checked: an allowed host cannot redirect to a host outside the list.
    port = server.rsplit(":", 1)[1]
    bounce = f"{server}/to?url=http://localhost:{port}/image.png"
    with pytest.raises(MediaForbiddenError, match="redirect target host 'localhost'"):
        run(load_image(bounce, trusted))


@pytest.mark.parametrize("route", ["/endless-chunked", "/endless-close", "/declares-huge"])
def test_byte_limit_enforced_while_streaming(server, route):
    policy = MediaPolicy(allowed_networks=("127.0.0.1/32",), max_bytes=64 * 1024)
    started = time.monotonic()
    with pytest.raises(MediaTooLargeError, match="64 KiB|65536 bytes"):
        run(load_image(f"{server}{route}", policy))
    assert time.monotonic() - started < 3  # stopped early, not after the server gave up


def test_read_timeout(server):
    policy = MediaPolicy(allowed_networks=("127.0.0.1/32",), read_timeout=0.3)
    with pytest.raises(MediaTimeoutError, match="reading"):
        run(load_image(f"{server}/slow", policy))


def test_total_timeout_catches_slow_drip(server):
    # Each byte arrives well within the read timeout; only the overall deadline stops it.
    policy = MediaPolicy(allowed_networks=("127.0.0.1/32",), read_timeout=2, total_timeout=0.5)
    started = time.monotonic()
    with pytest.raises(MediaTimeoutError, match="within 0.5 s"):
        run(load_image(f"{server}/drip", policy))
    assert time.monotonic() - started < 2


def test_http_errors_and_non_images(server):
    with pytest.raises(MediaDecodeError, match="not a supported image"):
        run(load_image(f"{server}/text", LOCAL))
    with pytest.raises(MediaFetchError, match="HTTP 404"):
        run(load_image(f"{server}/nope", LOCAL))
    with pytest.raises(MediaSourceError):
        run(load_image("ftp://example.com/a.png", LOCAL))


# --------------------------------------------------------------------------------------------
# data: URIs


def test_data_uri():
    loaded = run(load_image(_data_uri(JPEG, "image/jpeg"), MediaPolicy()))
    assert (loaded.source_kind, loaded.mime, loaded.data) == ("data", "image/jpeg", JPEG)
    # The declared type is not trusted for decoding; the bytes are sniffed.
    assert run(load_image(_data_uri(JPEG, "image/png"), MediaPolicy())).mime == "image/jpeg"


@pytest.mark.parametrize(
    ("uri", "error", "match"),
    [
        ("data:image/png;base64,@@not*base64@@", MediaSourceError, "not valid base64"),
        ("data:image/png;base64,iVBORw0KGgo", MediaSourceError, "not valid base64"),  # padding
        # excess padding: refused, as vLLM's pybase64.b64decode(validate=True) refuses it
        ("data:image/png;base64,aGVsbG8gd29ybGQh====", MediaSourceError, "not valid base64"),
        ("data:text/plain;base64,aGVsbG8=", MediaSourceError, "image/\\*"),
        ("data:;base64,aGVsbG8=", MediaSourceError, "image/\\*"),
        ("data:image/png,rawbytes", MediaSourceError, "base64"),
        ("data:image/png;base64", MediaSourceError, "missing ','"),
        ("data:image/png;base64,aGVsbG8gd29ybGQ=", MediaDecodeError, "not a supported image"),
    ],
)
def test_bad_data_uris(uri, error, match):
    with pytest.raises(error, match=match):
        run(load_image(uri, MediaPolicy()))


def test_data_uri_size_limit():
    with pytest.raises(MediaTooLargeError):
        run(load_image(_data_uri(JPEG), MediaPolicy(max_bytes=len(JPEG) - 1)))


# --------------------------------------------------------------------------------------------
# file:// URLs


@pytest.fixture
def media_root(tmp_path: Path) -> Path:
    root = tmp_path / "media"
    outside = tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "img.png").write_bytes(PNG)
    (outside / "secret.png").write_bytes(PNG)
    (root / "alias.png").symlink_to(root / "img.png")
    (root / "escape.png").symlink_to(outside / "secret.png")
    (root / "escape_dir").symlink_to(outside)
    return root


def test_file_under_root(media_root):
    policy = MediaPolicy(local_root=media_root)
    loaded = run(load_image((media_root / "img.png").as_uri(), policy))
    assert (loaded.source_kind, loaded.data) == ("file", PNG)
    # A symlink that stays inside the root is fine.
    assert run(load_image((media_root / "alias.png").as_uri(), policy)).data == PNG


@pytest.mark.parametrize(
    "make_url",
    [
        lambda root: (root.parent / "outside" / "secret.png").as_uri(),
        lambda root: f"file://{root}/../outside/secret.png",
        lambda root: f"file://{root}/%2e%2e/outside/secret.png",
        lambda root: (root / "escape.png").as_uri(),
        lambda root: f"file://{root}/escape_dir/secret.png",
        lambda root: root.as_uri(),
        lambda root: f"file://{root}/../outside/does-not-exist.png",  # no existence oracle
    ],
    ids=["outside", "dotdot", "encoded-dotdot", "symlink", "symlinked-dir", "root", "missing"],
)
def test_file_escaping_root_refused(media_root, make_url):
    with pytest.raises(MediaForbiddenError, match="not under the allowed"):
        run(load_image(make_url(media_root), MediaPolicy(local_root=media_root)))


def test_file_special_cases(media_root):
    policy = MediaPolicy(local_root=media_root)
    with pytest.raises(MediaForbiddenError, match="disabled"):
        run(load_image((media_root / "img.png").as_uri(), MediaPolicy()))
    with pytest.raises(MediaFetchError, match="not found"):
        run(load_image((media_root / "nope.png").as_uri(), policy))
    with pytest.raises(MediaSourceError, match="remote host"):
        run(load_image("file://fileserver/share/img.png", policy))
    os.mkfifo(media_root / "pipe.png")  # would block a naive reader forever
    with pytest.raises(MediaForbiddenError, match="regular file"):
        run(load_image((media_root / "pipe.png").as_uri(), policy))
    with pytest.raises(MediaTooLargeError):
        run(
            load_image(
                (media_root / "img.png").as_uri(), MediaPolicy(local_root=media_root, max_bytes=10)
            )
        )


# --------------------------------------------------------------------------------------------
# Decoding limits and failures


def test_decompression_bomb_refused_before_decoding():
    started = time.monotonic()
    # Beyond Pillow's own hard limit: Image.open raises, and we translate it.
    with pytest.raises(MediaTooLargeError, match="too large"):
        decode_image(_png_declaring(30000, 30000), MediaPolicy())
    # Under Pillow's limit but over ours: our header check refuses it.
    with pytest.raises(MediaTooLargeError, match="9000x8000"):
        decode_image(_png_declaring(9000, 8000), MediaPolicy())
    with pytest.raises(MediaTooLargeError, match="pixel limit"):
        decode_image(JPEG, MediaPolicy(max_pixels=64 * 48 - 1))
    assert time.monotonic() - started < 1
    # The same header with a small size is merely truncated: a decode error, not a size one.
    with pytest.raises(MediaDecodeError):
        decode_image(_png_declaring(300, 300), MediaPolicy())


def test_corrupt_and_unsupported_images():
    with pytest.raises(MediaDecodeError, match="truncated"):
        decode_image(JPEG[: len(JPEG) // 2], MediaPolicy())
    with pytest.raises(MediaDecodeError):
        decode_image(PNG[:40], MediaPolicy())
    with pytest.raises(MediaDecodeError, match="not a supported image"):
        decode_image(b"", MediaPolicy())
    tiff = _encode(_raw("RGB", (8, 8), 3, seed=16), "TIFF")
    with pytest.raises(MediaDecodeError, match="not a supported image"):
        decode_image(tiff, MediaPolicy())
    assert decode_image(tiff, MediaPolicy(allowed_formats=("TIFF",))).size == (8, 8)


def test_policy_validation(tmp_path):
    with pytest.raises(ValueError, match="MAX_IMAGE_PIXELS"):
        MediaPolicy(max_pixels=10**10)
    with pytest.raises(ValueError, match="allowed_networks"):
        MediaPolicy(allowed_networks=("not-a-cidr",))
    with pytest.raises(ValueError, match="directory"):
        MediaPolicy(local_root=tmp_path / "missing")
    policy = MediaPolicy(allowed_domains=("Images.Example",), allowed_networks=("10.1.2.3/8",))
    assert policy.allowed_domains == ("images.example",)
    assert policy.allowed_networks == ("10.0.0.0/8",)
    assert MediaPolicy(allowed_domains=()).allowed_domains is None  # vLLM: empty = unrestricted


# --------------------------------------------------------------------------------------------
# Errors and batches


def test_error_carries_index_and_reason():
    error = MediaDecodeError("corrupt")
    assert (str(error), error.reason, error.code) == ("corrupt", "corrupt", "decode_failed")
    error.index = 3
    assert str(error) == "image 3: corrupt"
    assert isinstance(MediaTimeoutError("t"), MediaFetchError)


def test_load_images_in_order_and_tags_failures(server):
    sources = [f"{server}/image.png", _data_uri(JPEG), f"{server}/r/1"]
    loaded = run(load_images(sources, LOCAL))
    assert [item.data for item in loaded] == [PNG, JPEG, PNG]

    with pytest.raises(MediaError) as info:
        run(load_images([_data_uri(PNG), "data:image/png;base64,@@", f"{server}/slow"], LOCAL))
    assert isinstance(info.value, MediaSourceError)
    assert info.value.index == 1
    assert str(info.value).startswith("image 1: ")
    assert run(load_images([], LOCAL)) == []


def test_download_then_decode_equals_load_images(server):
    """The gateway's path: downloads on the loop, then decoding in one thread."""
    sources = [f"{server}/image.png", _data_uri(JPEG)]
    downloaded = run(download_all(sources, LOCAL))
    assert downloaded == [PNG, None]  # data: URIs are decoded (base64 too) off the loop
    decoded = decode_sources(sources, downloaded, LOCAL)
    expected = run(load_images(sources, LOCAL))
    for got, want in zip(decoded, expected, strict=True):
        assert (got.data, got.source_kind, got.mime) == (want.data, want.source_kind, want.mime)
        assert np.array_equal(got.pixels, want.pixels)

    with pytest.raises(MediaError) as info:
        decode_sources([_data_uri(PNG), _data_uri(PNG[:100])], [None, None], LOCAL)
    assert isinstance(info.value, MediaDecodeError) and info.value.index == 1
    with pytest.raises(MediaError) as info:
        run(download_all([_data_uri(PNG), "ftp://x/y.png"], LOCAL))
    assert isinstance(info.value, MediaSourceError) and info.value.index == 1


# --------------------------------------------------------------------------------------------
# Pixel equality with vLLM


@pytest.fixture(scope="module")
def vllm_image_io():
    module = pytest.importorskip("vllm.multimodal.media.image")
    return module.ImageMediaIO()


@pytest.mark.parametrize("name", list(DECODE_CASES))
def test_decode_matches_vllm(vllm_image_io, name):
    data = DECODE_CASES[name]
    ours = decode_image(data, MediaPolicy())
    theirs = vllm_image_io.load_bytes(data).media
    assert ours.mode == theirs.mode == "RGB"
    assert ours.size == theirs.size
    assert np.array_equal(np.asarray(ours), np.asarray(theirs))


@pytest.mark.parametrize("name", list(DECODE_CASES))
def test_decode_pixels_matches_vllm(vllm_image_io, name):
    # The pipeline's decode (JPEGs straight into an array where that gives the same pixels).
    ours, mime = decode_pixels(DECODE_CASES[name], MediaPolicy())
    theirs = np.asarray(vllm_image_io.load_bytes(DECODE_CASES[name]).media)
    assert np.array_equal(np.asarray(ours), theirs)
    assert mime == decode_with_mime(DECODE_CASES[name], MediaPolicy())[1]


def test_decode_semantics_pinned():
    # What the vLLM comparison implies, stated directly so a vLLM change cannot hide it.
    rgba = np.asarray(decode_image(DECODE_CASES["rgba_png"], MediaPolicy()))
    assert (rgba[:8] == 255).all()  # alpha 0 composited onto white
    assert decode_image(DECODE_CASES["exif_rotate_90_jpeg"], MediaPolicy()).size == (40, 64)
    assert decode_image(DECODE_CASES["exif_rotate_180_jpeg"], MediaPolicy()).size == (64, 40)
    palette = np.asarray(decode_image(DECODE_CASES["palette_png_transparent"], MediaPolicy()))
    index0 = np.asarray(Image.open(BytesIO(DECODE_CASES["palette_png_transparent"]))) == 0
    assert index0.any() and (palette[index0] == 255).all()
