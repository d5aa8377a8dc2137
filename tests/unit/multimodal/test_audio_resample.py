"""multimodal.audio_resample against vLLM's own torchaudio resampling
(`vllm.multimodal.audio.resample_audio_torchaudio`, which the chat path uses), for the rates
clients send, at lengths from 0.2 s to past 30 s including odd ones."""

from __future__ import annotations

import numpy as np
import pytest

from multimodal.audio_resample import output_length, resample, sinc_kernel
from tests.support.audio_refs import require

# torch's conv1d and our matmul both sum the taps in float32, in different orders: a sample may
# differ in its last bits. Measured at most 3.0e-7 on full-scale noise (2.5 ulps at 1.0).
ATOL = 5e-7
RATES = [8000, 11025, 22050, 24000, 32000, 44100, 48000]
SECONDS = [0.2, 1.0001, 5.0, 31.0]


@pytest.fixture(scope="module")
def vllm_resample():
    require("torchaudio")
    return require("vllm.multimodal.audio").resample_audio_torchaudio


def _noise(samples: int, seed: int) -> np.ndarray:
    # Full scale, with a tone so the signal is not white: both ends of the kernel matter.
    rng = np.random.default_rng(seed)
    tone = 0.5 * np.sin(np.arange(samples) * 0.031)
    return np.clip(tone + 0.5 * rng.uniform(-1, 1, samples), -1, 1).astype(np.float32)


@pytest.mark.parametrize("orig", RATES)
def test_kernel_is_torchaudios(orig: int) -> None:
    transforms = require("torchaudio.transforms")
    reference = transforms.Resample(orig, 16000)
    kernel, width = sinc_kernel(orig, 16000)
    assert width == reference.width
    np.testing.assert_array_equal(kernel, reference.kernel.numpy()[:, 0, :])


@pytest.mark.parametrize("seconds", SECONDS)
@pytest.mark.parametrize("orig", RATES)
def test_resample_equals_vllm(vllm_resample, orig: int, seconds: float) -> None:
    audio = _noise(int(orig * seconds) + 1, seed=orig)  # +1: never a whole number of periods
    expected = vllm_resample(audio, orig_sr=orig, target_sr=16000)
    got = resample(audio, orig, 16000)
    assert got.dtype == np.float32
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=0, atol=ATOL)


def test_output_length_keeps_torchaudios_float32_ceiling(vllm_resample) -> None:
    # 160 * L / 441 = integer + 1/441 rounds down in float32 past 65,536 output samples, so
    # torchaudio returns one sample fewer than the exact ceiling; the gateway must too.
    length = next(n for n in range(441 * 500, 441 * 1000) if 160 * n % 441 == 1)
    assert output_length(length, 44100, 16000) == -(-160 * length // 441) - 1
    audio = _noise(length, seed=1)
    expected = vllm_resample(audio, orig_sr=44100, target_sr=16000)
    assert resample(audio, 44100, 16000).shape == expected.shape


def test_same_rate_and_stereo(vllm_resample) -> None:
    audio = _noise(4801, seed=2)
    np.testing.assert_array_equal(resample(audio, 16000, 16000), audio)
    stereo = np.stack([audio, audio[::-1]])
    expected = vllm_resample(stereo, orig_sr=48000, target_sr=16000)
    np.testing.assert_allclose(resample(stereo, 48000, 16000), expected, rtol=0, atol=ATOL)


def test_float64_input_is_cast_to_float32_first(vllm_resample) -> None:
    audio = _noise(22051, seed=3).astype(np.float64) + 1e-9
    expected = vllm_resample(audio, orig_sr=22050, target_sr=16000)
    np.testing.assert_allclose(resample(audio, 22050, 16000), expected, rtol=0, atol=ATOL)
