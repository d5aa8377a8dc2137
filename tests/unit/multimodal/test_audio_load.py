"""multimodal.audio_load gives the 16 kHz mono samples vLLM's speech-to-text server decodes
(`vllm.multimodal.media.audio.load_audio(sr=16000)`: soundfile then PyAV, resampled by
libswresample), bit for bit, for the files the chat-path decoder tests use; and its limits."""

from __future__ import annotations

import io

import numpy as np
import pytest

from multimodal.audio_decode import AudioDecodeError, AudioTooLarge
from multimodal.audio_load import load_audio
from tests.support.audio_refs import require
from tests.unit.multimodal.test_audio_decode import FILES


@pytest.fixture(scope="module")
def vllm_load():
    require("soundfile")
    require("av")
    loader = require("vllm.multimodal.media.audio").load_audio

    def load(data: bytes, **limits) -> np.ndarray:
        samples, rate = loader(io.BytesIO(data), sr=16000, mono=True, **limits)
        assert rate == 16000
        return samples

    return load


@pytest.mark.parametrize("name", list(FILES))
def test_load_equals_vllm_transcription_loader(vllm_load, name: str) -> None:
    data = FILES[name]()
    expected = vllm_load(data)
    samples = load_audio(data, 16000)
    assert samples.dtype == expected.dtype
    np.testing.assert_array_equal(samples, expected)


def test_short_clip_is_padded_before_resampling(vllm_load) -> None:
    # Under 1024 samples libswresample gives nothing back: vLLM pads, then cuts to length.
    sf = require("soundfile")
    buffer = io.BytesIO()
    sf.write(buffer, np.linspace(-0.5, 0.5, 500, dtype=np.float32), 44100, format="WAV")
    data = buffer.getvalue()
    samples = load_audio(data, 16000)
    assert samples.shape == (182,)  # ceil(500 * 16000 / 44100)
    np.testing.assert_array_equal(samples, vllm_load(data))


def test_not_audio(vllm_load) -> None:
    data = b"this is not audio" * 64
    with pytest.raises(ValueError):
        vllm_load(data)
    with pytest.raises(AudioDecodeError):
        load_audio(data, 16000)


@pytest.mark.parametrize("name", ["wav_int16_stereo_24k", "aac_mp4_stereo_24k"])
def test_limits_refuse_where_vllm_does(vllm_load, name: str) -> None:
    data = FILES[name]()  # 1.3 s
    for limits in ({"max_duration_s": 1.0}, {"max_decode_bytes": 4096}):
        with pytest.raises(ValueError):
            vllm_load(data, **limits)
        with pytest.raises(AudioTooLarge):
            load_audio(data, 16000, **limits)
    assert load_audio(data, 16000, max_duration_s=2.0).size > 0
