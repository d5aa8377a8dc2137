"""multimodal.audio: what the gateway checks of an audio clip before a worker (or the gateway)
decodes it: its bytes, container, header and decoded samples, each failure a MediaError naming
the clip's kind."""

from __future__ import annotations

import base64
import io
import time

import numpy as np
import pytest

from multimodal import audio as audio_module
from multimodal.audio import AudioInfo, checked_audio, load_audio, probe_audio, sniff_audio
from multimodal.errors import MediaDecodeError, MediaError, MediaForbiddenError, MediaTooLargeError
from multimodal.policy import MediaPolicy
from tests.support.audio_refs import require
from tests.support.http_files import serve_bytes

# (soundfile format, subtype, sample rate, sniffed type): the containers the gateway takes.
CONTAINERS = [
    ("WAV", "PCM_16", 16000, "audio/wav"),
    ("FLAC", "PCM_16", 44100, "audio/flac"),
    ("MP3", "MPEG_LAYER_III", 44100, "audio/mpeg"),
    ("OGG", "VORBIS", 22050, "audio/ogg"),
    ("OGG", "OPUS", 48000, "audio/ogg"),
]


def clip(
    seconds: float = 0.5,
    rate: int = 16000,
    channels: int = 1,
    fmt: str = "WAV",
    subtype: str = "PCM_16",
    seed: int = 0,
) -> bytes:
    """A tone under a little noise, written by soundfile in the given container."""
    soundfile = require("soundfile")
    t = np.arange(round(seconds * rate)) / rate
    rng = np.random.default_rng(seed)
    tone = 0.3 * np.sin(2 * np.pi * 440 * t)
    samples = np.stack([tone * (0.5 + k / 2) for k in range(channels)], axis=1)
    samples += 0.02 * rng.standard_normal(samples.shape)
    buffer = io.BytesIO()
    soundfile.write(buffer, samples.astype(np.float32), rate, format=fmt, subtype=subtype)
    return buffer.getvalue()


def data_url(raw: bytes, mime: str = "audio/wav") -> str:
    return f"data:{mime};base64,{base64.b64encode(raw).decode()}"


@pytest.mark.parametrize(("fmt", "subtype", "rate", "mime"), CONTAINERS)
def test_each_container_is_forwarded_as_its_own_bytes_under_its_sniffed_type(
    fmt, subtype, rate, mime
):
    raw = clip(0.5, rate, 2, fmt, subtype)
    # the declared type is the client's and is ignored, as vLLM ignores it
    assert checked_audio(data_url(raw, "audio/x-anything"), None, MediaPolicy()) == data_url(
        raw, mime
    )


def test_a_loaded_clip_keeps_its_rate_and_channels():
    loaded = load_audio(data_url(clip(0.5, 44100, 2)), None, MediaPolicy())
    assert (loaded.audio.sample_rate, loaded.audio.samples.shape) == (44100, (2, 22050))
    assert loaded.mime == "audio/wav"


def test_the_header_is_read_without_decoding():
    assert probe_audio(clip(1.5, 44100, 2)) == AudioInfo(44100, 2, 1.5)
    mp3 = probe_audio(clip(1.0, 44100, 1, "MP3", "MPEG_LAYER_III"))
    assert (mp3.sample_rate, mp3.channels) == (44100, 1)


def test_sniffing_takes_the_four_formats_and_nothing_else():
    assert sniff_audio(clip(fmt="FLAC")) == "audio/flac"
    mp3 = clip(fmt="MP3", subtype="MPEG_LAYER_III")
    # an ID3v2 tag (syncsafe size 0x0101 = 129 bytes) before the first frame
    tag = b"ID3\x04\x00\x00\x00\x00\x01\x01" + b"\x00" * 129
    assert sniff_audio(tag + mp3) == "audio/mpeg"
    assert sniff_audio(tag[:20]) is None  # the tag runs past the end
    assert sniff_audio(b"\xff\xf1\x50\x80" + bytes(60)) is None  # AAC's ADTS shares the sync
    # containers libsndfile or FFmpeg would read, but clients of a chat API do not send
    assert sniff_audio(clip(fmt="AIFF")) is None
    assert sniff_audio(clip(fmt="CAF")) is None
    assert sniff_audio(b"\x00\x00\x00\x20ftypM4A " + bytes(40)) is None


@pytest.mark.parametrize(
    "raw",
    [b"not audio at all" * 8, b"RIFF\x00\x00\x00\x00WAVEfmt ", b"OggS" + bytes(60)],
    ids=["garbage", "wav-header-only", "ogg-page-header-only"],
)
def test_garbage_and_headers_without_audio_are_decode_errors(raw):
    with pytest.raises(MediaDecodeError) as refused:
        checked_audio(data_url(raw), None, MediaPolicy())
    assert refused.value.kind == "audio"
    assert refused.value.status == 400


@pytest.mark.parametrize(("fmt", "subtype"), [("FLAC", "PCM_16"), ("MP3", "MPEG_LAYER_III")])
def test_a_clip_cut_after_its_header_is_a_decode_error(fmt, subtype):
    raw = clip(1.0, 16000, 1, fmt, subtype)
    with pytest.raises(MediaDecodeError, match="invalid or corrupted"):
        checked_audio(data_url(raw[:100]), None, MediaPolicy())


def test_byte_limit_applies_to_the_encoded_clip():
    raw = clip(0.5)
    assert checked_audio(data_url(raw), None, MediaPolicy(max_audio_bytes=len(raw)))
    with pytest.raises(MediaTooLargeError, match="audio exceeds the .* bytes size limit"):
        checked_audio(data_url(raw), None, MediaPolicy(max_audio_bytes=len(raw) - 1))
    # the image limit is not the audio one
    assert checked_audio(data_url(raw), None, MediaPolicy(max_bytes=10))


def test_too_long_too_many_channels_too_high_a_rate_or_too_much_pcm_are_refused():
    cases = [
        (clip(3.0), MediaPolicy(max_audio_seconds=2), "lasts 3.0 s, above the 2 s limit"),
        (clip(0.2, channels=3), MediaPolicy(max_audio_channels=2), "3 channels, above the 2"),
        (clip(0.2, rate=48000), MediaPolicy(max_audio_sample_rate=44100), "48000 Hz, above"),
        (clip(1.0, 48000, 2), MediaPolicy(max_audio_decoded_bytes=100_000), "MiB of samples"),
    ]
    for raw, policy, message in cases:
        with pytest.raises(MediaTooLargeError, match=message) as refused:
            checked_audio(data_url(raw), None, policy)
        assert refused.value.kind == "audio"


def test_the_samples_are_held_to_the_limits_when_the_header_says_less(monkeypatch):
    # a header that states one second, believed by the decoder too: the samples still count
    real = audio_module.decode_audio
    monkeypatch.setattr(audio_module, "probe_audio", lambda data: AudioInfo(16000, 1, 1.0))
    monkeypatch.setattr(audio_module, "decode_audio", lambda data, **limits: real(data))
    with pytest.raises(MediaTooLargeError, match="lasts 3.0 s, above the 2 s limit"):
        checked_audio(data_url(clip(3.0)), None, MediaPolicy(max_audio_seconds=2))
    with pytest.raises(MediaTooLargeError, match="MiB of samples"):
        checked_audio(data_url(clip(3.0)), None, MediaPolicy(max_audio_decoded_bytes=1000))


def test_a_decode_slower_than_the_timeout_is_refused(monkeypatch):
    real = audio_module.decode_audio

    def slow(*args, **kwargs):
        time.sleep(0.05)
        return real(*args, **kwargs)

    monkeypatch.setattr(audio_module, "decode_audio", slow)
    with pytest.raises(MediaTooLargeError, match="took longer than the 0.01 s limit"):
        checked_audio(data_url(clip()), None, MediaPolicy(audio_decode_timeout=0.01))


def test_any_data_uri_media_type_is_read_but_the_payload_must_be_base64():
    raw = clip()
    for mime in ("audio/", "application/octet-stream", ""):  # input_audio without a format
        assert checked_audio(data_url(raw, mime), None, MediaPolicy()) == data_url(raw)
    with pytest.raises(MediaError, match="not valid base64"):
        checked_audio("data:audio/wav;base64,@@@@", None, MediaPolicy())
    with pytest.raises(MediaError, match="base64-encoded"):
        checked_audio("data:audio/wav,RIFF", None, MediaPolicy())


def test_http_clips_follow_the_image_fetch_rules():
    import asyncio

    from multimodal.media import download

    raw = clip(fmt="FLAC")
    with serve_bytes(raw, "audio/flac") as base:
        url = f"{base}/a.flac"
        with pytest.raises(MediaForbiddenError, match="loopback"):
            asyncio.run(download(url, MediaPolicy().for_audio()))
        policy = MediaPolicy(allowed_networks=("127.0.0.0/8",))
        fetched = asyncio.run(download(url, policy.for_audio()))
    assert checked_audio(url, fetched, policy) == data_url(raw, "audio/flac")
    with pytest.raises(MediaForbiddenError, match="file:// URLs are disabled"):
        checked_audio("file:///etc/passwd", None, MediaPolicy())


def test_a_local_file_under_the_media_root(tmp_path):
    raw = clip()
    (tmp_path / "a.wav").write_bytes(raw)
    policy = MediaPolicy(local_root=tmp_path)
    assert checked_audio((tmp_path / "a.wav").as_uri(), None, policy) == data_url(raw)


def test_the_audio_limits_must_be_positive():
    for name in ("max_audio_bytes", "max_audio_seconds", "max_audio_channels"):
        with pytest.raises(ValueError, match=name):
            MediaPolicy(**{name: 0})
