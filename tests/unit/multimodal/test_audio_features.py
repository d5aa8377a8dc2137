"""multimodal.audio_features against transformers' WhisperFeatureExtractor as vLLM's Qwen2-Audio
(truncation=True) and Qwen2.5-Omni (truncation=False) processors call it: 16 kHz, padding to
30 s, attention mask returned, torch installed (so its float32 torch path runs, as in vLLM)."""

from __future__ import annotations

import numpy as np
import pytest

from multimodal.audio_features import (
    attention_mask,
    audio_token_count,
    extract_features,
    mel_filters,
    padded_length,
)
from tests.support.audio_refs import require

# Ours is float64 rounded once; torch's FFT, |X|^2 and mel matmul are float32 at every step.
# Their difference after (x + 4) / 4 peaks in mel bins far below the clip's loudest (a float32
# FFT's error is relative to the frame's energy, not the bin's): measured at most 2.4e-5 on
# these clips (a pure tone at 1 kHz, noise past 30 s), typically ~2e-8.
ATOL = 5e-5
SR = 16000


def _tone(seconds: float, hz: float, amplitude: float) -> np.ndarray:
    t = np.arange(round(seconds * SR)) / SR
    return (amplitude * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def _noise(samples: int, seed: int, amplitude: float = 1.0) -> np.ndarray:
    return (amplitude * np.random.default_rng(seed).uniform(-1, 1, samples)).astype(np.float32)


def _click(samples: int, at: int) -> np.ndarray:
    audio = np.zeros(samples, np.float32)
    audio[at] = 1.0
    return audio


CLIPS = {
    "0.2s": lambda: _noise(3200, 1, 0.1),
    "odd": lambda: _noise(12345, 2, 0.2),
    "5s_tone_noise": lambda: _tone(5, 440, 0.5) + _noise(80000, 3, 0.01),
    "5s_pure_tone": lambda: _tone(5, 1000, 0.9),
    "30s": lambda: _noise(480000, 4),
    "31s": lambda: _noise(496000, 5),
    "31s_odd": lambda: _noise(496005, 6, 0.3),  # not a multiple of the hop: mask len // 160
    "silence": lambda: np.zeros(80000, np.float32),
    # 1e-4 noise: max - 8 is below the padding's -10, which stays unclamped (-1.5).
    "quiet": lambda: _noise(80000, 9, 1e-4),
    # One loud sample in zeros: the padding's -10 is clamped up to max - 8. Only the frames
    # whose window reaches it are transformed; at the start and end of the clip the reflect
    # padding and the clip's zero padding meet it.
    "click": lambda: _click(16000, 8000),
    "click_at_start": lambda: _click(5000, 0),
    "click_at_end": lambda: _click(12345, 12344),
    # At 30 s: the last frame's window reaches the end's reflect padding (every frame live),
    # and one that leaves the last frame out (its window holds only zeros and their mirror).
    "click_at_30s": lambda: _click(480000, 479999),
    "click_before_30s": lambda: _click(480000, 479500),
    "full_scale": lambda: np.sign(np.random.default_rng(7).standard_normal(80000)).astype(
        np.float32
    ),
}


@pytest.fixture(scope="module")
def whisper():
    require("torch")
    extractor = require("transformers").WhisperFeatureExtractor
    return {bins: extractor(feature_size=bins) for bins in (128, 80)}


@pytest.fixture(scope="module")
def whisper_300s():
    """The released Qwen2.5-Omni extractor: chunk_length 300, every clip padded to 300 s."""
    require("torch")
    return require("transformers").WhisperFeatureExtractor(feature_size=128, chunk_length=300)


def _reference(extractor, clips: list[np.ndarray], truncate: bool) -> dict[str, np.ndarray]:
    return extractor(
        clips,
        sampling_rate=SR,
        padding="max_length",
        truncation=truncate,
        return_attention_mask=True,
        return_tensors="np",
    )


@pytest.mark.parametrize("bins", [128, 80])
def test_mel_filters_are_transformers(bins: int) -> None:
    audio_utils = require("transformers.audio_utils")
    expected = audio_utils.mel_filter_bank(
        num_frequency_bins=201,
        num_mel_filters=bins,
        min_frequency=0.0,
        max_frequency=8000.0,
        sampling_rate=SR,
        norm="slaney",
        mel_scale="slaney",
    )
    np.testing.assert_array_equal(mel_filters(bins), expected)


@pytest.mark.parametrize("truncate", [True, False], ids=["qwen2_audio", "omni"])
@pytest.mark.parametrize("bins", [128, 80])
@pytest.mark.parametrize("clip", list(CLIPS))
def test_features_equal_whisper_extractor(whisper, clip: str, bins: int, truncate: bool) -> None:
    audio = CLIPS[clip]()
    expected = _reference(whisper[bins], [audio], truncate)
    got = extract_features(audio, num_mel_filters=bins, truncate=truncate)
    assert got.input_features.dtype == np.float32
    assert got.input_features.shape == expected["input_features"][0].shape
    np.testing.assert_array_equal(got.feature_attention_mask, expected["attention_mask"][0])
    np.testing.assert_allclose(got.input_features, expected["input_features"][0], rtol=0, atol=ATOL)


@pytest.mark.parametrize(
    "clip", ["0.2s", "5s_tone_noise", "31s_odd", "silence", "quiet", "click", "click_at_end"]
)
def test_features_equal_whisper_extractor_padded_to_300s(whisper_300s, clip: str) -> None:
    """Omni's case (not truncated, 30,000 frames): only the frames touching real samples are
    computed; the rest must be exactly what transformers gives its all-zero frames."""
    audio = CLIPS[clip]()
    expected = _reference(whisper_300s, [audio], False)
    got = extract_features(audio, num_mel_filters=128, truncate=False, chunk_samples=4_800_000)
    assert got.input_features.shape == expected["input_features"][0].shape == (128, 30000)
    assert got.live.shape[1] < 30000
    np.testing.assert_array_equal(got.feature_attention_mask, expected["attention_mask"][0])
    np.testing.assert_allclose(got.input_features, expected["input_features"][0], rtol=0, atol=ATOL)
    n = got.feature_length
    np.testing.assert_array_equal(got.first_frames(n), got.input_features[:, :n])


@pytest.mark.parametrize(
    ("clip", "clamped"), [("click", True), ("quiet", False), ("silence", False)]
)
def test_padding_value_is_clamped_per_clip(whisper, clip: str, clamped: bool) -> None:
    """The padding's log-mel is the 1e-10 floor (-10, so -1.5 after (x + 4) / 4) unless the
    clip's max - 8 is above it: then the clamp lifts it, as it does in transformers."""
    audio = CLIPS[clip]()
    padding = _reference(whisper[128], [audio], True)["input_features"][0][:, -1]
    got = extract_features(audio, num_mel_filters=128, truncate=True)
    assert (padding > -1.5 + 0.1).all() if clamped else (padding == -1.5).all()
    np.testing.assert_allclose(np.full(128, got.fill), padding, rtol=0, atol=ATOL)


def test_batch_of_two_is_per_clip(whisper) -> None:
    # vLLM hands every clip of a request to one extractor call; the max-8 clamp is per clip.
    loud, quiet = _noise(80000, 8), _tone(2.5, 300, 0.001)
    expected = _reference(whisper[128], [loud, quiet], True)
    for index, audio in enumerate([loud, quiet]):
        got = extract_features(audio, num_mel_filters=128, truncate=True)
        np.testing.assert_array_equal(got.feature_attention_mask, expected["attention_mask"][index])
        np.testing.assert_allclose(
            got.input_features, expected["input_features"][index], rtol=0, atol=ATOL
        )


@pytest.mark.parametrize(
    ("samples", "truncate", "frames", "tokens"),
    [
        (3200, True, 20, 5),
        (12345, True, 78, 19),  # ceil(12345 / 160)
        (480000, True, 3000, 750),
        (496000, True, 3000, 750),  # Qwen2-Audio cuts at 30 s
        (496000, False, 3100, 775),  # Omni does not
        (496005, False, 3100, 775),  # past 30 s the mask has len // 160 frames, not ceil
    ],
)
def test_feature_lengths_and_tokens(samples: int, truncate: bool, frames: int, tokens: int) -> None:
    total = padded_length(samples, truncate=truncate)
    mask = attention_mask(min(samples, total), total)
    assert mask.sum() == frames
    assert mask.shape[0] == total // 160
    assert audio_token_count(frames) == tokens
    features = extract_features(np.ones(samples, np.float32), num_mel_filters=80, truncate=truncate)
    assert features.input_features.shape == (80, mask.shape[0])
    assert (features.feature_length, features.num_audio_tokens) == (frames, tokens)
