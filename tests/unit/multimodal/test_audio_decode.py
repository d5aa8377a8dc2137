"""multimodal.audio_decode yields the samples and rate vLLM's own loader does
(`AudioMediaIO.load_bytes`: soundfile, then PyAV, channels averaged), bit for bit, for files
written here: WAV (int16, 24-bit, float32), FLAC, OGG (Vorbis, Opus), MP3 through libsndfile
and AAC in MP4 through the PyAV fallback."""

from __future__ import annotations

import io
import time

import numpy as np
import pytest

from multimodal.audio_decode import (
    AudioDecodeError,
    AudioDecodeTimeout,
    AudioTooLarge,
    decode_audio,
)
from tests.support.audio_refs import require


def _signal(rate: int, seconds: float, channels: int) -> np.ndarray:
    # [samples, channels]: a different tone per channel plus noise, within [-1, 1].
    t = np.arange(round(rate * seconds)) / rate
    rng = np.random.default_rng(channels)
    tones = [0.4 * np.sin(2 * np.pi * (220 + 110 * c) * t) for c in range(channels)]
    return np.stack([x + 0.05 * rng.standard_normal(t.size) for x in tones], axis=1).astype(
        np.float32
    )


def _soundfile_bytes(audio: np.ndarray, rate: int, fmt: str, subtype: str) -> bytes:
    buffer = io.BytesIO()
    require("soundfile").write(buffer, audio, rate, format=fmt, subtype=subtype)
    return buffer.getvalue()


def _aac_in_mp4(audio: np.ndarray, rate: int) -> bytes:
    av = require("av")
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as container:
        stream = container.add_stream("aac", rate=rate)
        stream.layout = "stereo"
        frame = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(audio.T), format="fltp", layout="stereo"
        )
        frame.sample_rate = rate
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)
    return buffer.getvalue()


FILES = {
    "wav_int16_stereo_24k": lambda: _soundfile_bytes(
        _signal(24000, 1.3, 2), 24000, "WAV", "PCM_16"
    ),
    "wav_24bit_stereo_44k": lambda: _soundfile_bytes(
        _signal(44100, 0.7, 2), 44100, "WAV", "PCM_24"
    ),
    "wav_float_6ch_48k": lambda: _soundfile_bytes(_signal(48000, 0.5, 6), 48000, "WAV", "FLOAT"),
    "wav_int16_mono_16k": lambda: _soundfile_bytes(_signal(16000, 0.2, 1), 16000, "WAV", "PCM_16"),
    "flac_stereo_44k": lambda: _soundfile_bytes(_signal(44100, 1.0, 2), 44100, "FLAC", "PCM_16"),
    "ogg_vorbis_stereo_24k": lambda: _soundfile_bytes(
        _signal(24000, 1.3, 2), 24000, "OGG", "VORBIS"
    ),
    "ogg_opus_mono_48k": lambda: _soundfile_bytes(_signal(48000, 1.0, 1), 48000, "OGG", "OPUS"),
    "mp3_stereo_44k": lambda: _soundfile_bytes(
        _signal(44100, 1.1, 2), 44100, "MP3", "MPEG_LAYER_III"
    ),
    "aac_mp4_stereo_24k": lambda: _aac_in_mp4(_signal(24000, 1.3, 2), 24000),
}


@pytest.fixture(scope="module")
def vllm_load():
    require("soundfile")
    require("av")
    media_io = require("vllm.multimodal.media.audio").AudioMediaIO()
    return media_io.load_bytes


@pytest.mark.parametrize("name", list(FILES))
def test_decode_equals_vllm_loader(vllm_load, name: str) -> None:
    data = FILES[name]()
    expected, expected_rate = vllm_load(data)
    decoded = decode_audio(data)
    assert decoded.backend == ("pyav" if name.startswith("aac") else "soundfile")
    assert decoded.samples.dtype == np.float32
    assert decoded.sample_rate == expected_rate
    mono = decoded.mono()
    assert mono.dtype == expected.dtype == np.float32
    np.testing.assert_array_equal(mono, expected)


def test_channels_first(vllm_load) -> None:
    decoded = decode_audio(FILES["wav_float_6ch_48k"]())
    assert decoded.samples.shape == (6, 24000)
    np.testing.assert_array_equal(decoded.samples.T, _signal(48000, 0.5, 6))  # float WAV: exact


def test_not_audio_is_refused_like_vllm(vllm_load) -> None:
    data = b"this is not audio" * 64
    with pytest.raises(ValueError):
        vllm_load(data)
    with pytest.raises(AudioDecodeError):
        decode_audio(data)


def test_duration_limit() -> None:
    data = FILES["wav_int16_stereo_24k"]()
    with pytest.raises(AudioTooLarge):
        decode_audio(data, max_duration_s=1.0)
    with pytest.raises(AudioTooLarge):
        decode_audio(_aac_in_mp4(_signal(24000, 1.3, 2), 24000), max_duration_s=1.0)
    assert decode_audio(data, max_duration_s=2.0).samples.shape == (2, 31200)


def test_pcm_size_limit() -> None:
    data = FILES["wav_int16_stereo_24k"]()  # 31,200 frames x 2 channels x 4 bytes
    with pytest.raises(AudioTooLarge):
        decode_audio(data, max_decode_bytes=31200 * 2 * 4 - 1)
    assert decode_audio(data, max_decode_bytes=31200 * 2 * 4).channels == 2


def test_a_read_in_blocks_equals_one_whole_read() -> None:
    """Past one block (2**18 frames) the samples come a block at a time: the same floats."""
    soundfile = require("soundfile")
    for fmt, subtype in (("WAV", "PCM_16"), ("FLAC", "PCM_24")):
        data = _soundfile_bytes(_signal(44100, 13.0, 2), 44100, fmt, subtype)
        whole, _ = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=False)
        got = decode_audio(data)
        assert got.samples.shape[1] > 2**18 * 2
        np.testing.assert_array_equal(got.samples, whole.T)


def test_a_passed_deadline_stops_decoding() -> None:
    wav = FILES["wav_int16_stereo_24k"]()
    aac = _aac_in_mp4(_signal(24000, 1.3, 2), 24000)  # FFmpeg's path
    for data in (wav, aac):
        with pytest.raises(AudioDecodeTimeout):
            decode_audio(data, deadline=time.monotonic() - 1)
        assert decode_audio(data, deadline=time.monotonic() + 60).channels == 2
