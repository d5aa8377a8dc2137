"""multimodal.audio_chunking cuts where vLLM's speech-to-text server cuts
(`vllm.multimodal.audio.split_audio` with Whisper's 30 s clips, 1 s overlap, 1600-sample
windows): at the start of the quietest 100 ms window of the second before each mark."""

from __future__ import annotations

import numpy as np
import pytest

from multimodal.audio_chunking import find_split_point, split_audio
from tests.support.audio_refs import require

RATE = 16000


@pytest.fixture(scope="module")
def vllm_split():
    audio = require("vllm.multimodal.audio")

    def split(samples: np.ndarray) -> list[np.ndarray]:
        return audio.split_audio(samples, RATE, 30, 1, 1600)

    return split


def _noise(seconds: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (0.3 * rng.standard_normal(round(seconds * RATE))).astype(np.float32)


def test_cut_at_the_quiet_window_before_the_mark() -> None:
    samples = _noise(45)
    quiet = 29 * RATE + 3 * 1600  # the 4th window of the second before 30 s
    samples[quiet : quiet + 1600] *= 0.01
    clips = split_audio(samples, RATE)
    assert [c.size for c in clips] == [quiet, samples.size - quiet]
    np.testing.assert_array_equal(np.concatenate(clips), samples)


def test_quiet_audio_past_the_search_windows_is_not_found() -> None:
    # The windows end strictly before the search end: the last 100 ms before the mark is
    # never a candidate (range(0, 16000 - 1600, 1600) is 9 windows), as in vLLM.
    samples = _noise(40)
    samples[30 * RATE - 1600 : 30 * RATE] = 0
    cut = find_split_point(samples, 29 * RATE, 30 * RATE, 1600)
    assert 29 * RATE <= cut < 30 * RATE - 1600


@pytest.mark.parametrize("seconds", [2.0, 30.0, 30.01, 31.0, 59.5, 61.0, 95.3])
def test_clips_equal_vllm(vllm_split, seconds: float) -> None:
    samples = _noise(seconds, seed=int(seconds * 10))
    rng = np.random.default_rng(1)
    for mark in range(29, int(seconds), 29):  # a quiet spot somewhere in some search spans
        start = mark * RATE + int(rng.integers(0, RATE - 1600))
        samples[start : start + 1600] *= 0.05
    ours, theirs = split_audio(samples, RATE), vllm_split(samples)
    assert [c.size for c in ours] == [c.size for c in theirs]
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(a, b)


def test_ties_and_nan_windows_like_vllm(vllm_split) -> None:
    samples = np.zeros(62 * RATE, dtype=np.float32)  # every window equally quiet: the first
    samples[29 * RATE : 29 * RATE + 1600] = np.nan  # skipped, as vLLM skips a NaN energy
    ours = [c.size for c in split_audio(samples, RATE)]
    assert ours == [c.size for c in vllm_split(samples)]
    assert ours[0] == 29 * RATE + 1600


def test_mono_only() -> None:
    with pytest.raises(ValueError):
        split_audio(np.zeros((2, 100), dtype=np.float32), RATE)
