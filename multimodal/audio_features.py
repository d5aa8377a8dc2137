"""Whisper log-mel features as vLLM computes them for Qwen2-Audio and Qwen2.5-Omni, without torch.

vLLM hands 16 kHz mono float32 audio to transformers' WhisperFeatureExtractor through the model's
HF processor, and with torch installed the extractor takes its torch path
(`_torch_extract_fbank_features`, float32 on CPU): reflect-padded STFT (n_fft 400, hop 160,
periodic Hann), |X|^2 with the last frame dropped, Slaney mel filters to 8 kHz, log10 floored
at 1e-10, clamped at (max - 8) per clip, then (x + 4) / 4.

Here the same steps run in float64 numpy from the same float32 inputs (window and filters
rounded to float32 as torch holds them) and the result is rounded once to float32: torch's
float32 FFT and matmul round at every step, so the two agree to float32 noise rather than
bit for bit; the tests state the measured maximum error.

How long the padded audio is, and which frames count, follows what the processors ask for:
both pad to the extractor's `n_samples` (`padding="max_length"`: 30 s for Qwen2-Audio, 300 s
for the released Qwen2.5-Omni, whose chunk_length is 300) and return the attention mask;
Qwen2-Audio truncates past 30 s (vLLM passes `truncation=True`), Qwen2.5-Omni does not (vLLM's
processor passes `truncation=False` to every modality, and Omni does not override it), so a 31 s
clip there gives 3,100 real frames (of 30,000) and 775 audio tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import numpy.typing as npt

SAMPLING_RATE = 16000
N_FFT = 400
HOP_LENGTH = 160
CHUNK_SAMPLES = 30 * SAMPLING_RATE  # WhisperFeatureExtractor.n_samples: chunk_length 30 s
MAX_FREQUENCY = 8000.0


def _hertz_to_mel(freq: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    # Slaney's scale: linear below 1 kHz, logarithmic above (transformers.audio_utils).
    logstep = 27.0 / np.log(6.4)
    mels = 3.0 * freq / 200.0
    log_region = freq >= 1000.0
    mels[log_region] = 15.0 + np.log(freq[log_region] / 1000.0) * logstep
    return mels


def _mel_to_hertz(mels: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    logstep = np.log(6.4) / 27.0
    freq = 200.0 * mels / 3.0
    log_region = mels >= 15.0
    freq[log_region] = 1000.0 * np.exp(logstep * (mels[log_region] - 15.0))
    return freq


@lru_cache(maxsize=4)
def mel_filters(num_mel_filters: int) -> npt.NDArray[np.float64]:
    """Slaney-normalised triangular filters [201 frequency bins, num_mel_filters], 0-8 kHz.

    The same arithmetic, in the same order, as transformers' `mel_filter_bank(norm="slaney",
    mel_scale="slaney")` as WhisperFeatureExtractor builds it, so the float64 values are equal.
    """
    num_frequency_bins = 1 + N_FFT // 2
    edges = _hertz_to_mel(np.array([0.0, MAX_FREQUENCY]))
    mel_freqs = np.linspace(edges[0], edges[1], num_mel_filters + 2)
    filter_freqs = _mel_to_hertz(mel_freqs)
    fft_freqs = np.linspace(0, SAMPLING_RATE // 2, num_frequency_bins)
    filter_diff = np.diff(filter_freqs)
    slopes = np.expand_dims(filter_freqs, 0) - np.expand_dims(fft_freqs, 1)
    down_slopes = -slopes[:, :-2] / filter_diff[:-1]
    up_slopes = slopes[:, 2:] / filter_diff[1:]
    filters = np.maximum(np.zeros(1), np.minimum(down_slopes, up_slopes))
    enorm = 2.0 / (filter_freqs[2 : num_mel_filters + 2] - filter_freqs[:num_mel_filters])
    filters *= np.expand_dims(enorm, 0)
    filters.flags.writeable = False
    return filters


@lru_cache(maxsize=1)
def _hann_window() -> npt.NDArray[np.float64]:
    # torch.hann_window(400) in float32: n * float32(2*pi/400), cos, * -0.5 + 0.5. The cosine
    # is rounded correctly here; torch's vectorised float32 cosine differs in the last bit for
    # a dozen of the 400 values (<= 6e-8), well below the FFT's own rounding.
    angle = np.arange(N_FFT, dtype=np.float32) * np.float32(2 * math.pi / N_FFT)
    cosine = np.cos(angle.astype(np.float64)).astype(np.float32)
    window = (cosine * np.float32(-0.5) + np.float32(0.5)).astype(np.float64)
    window.flags.writeable = False
    return window


@lru_cache(maxsize=4)
def _filter_bands(num_mel_filters: int) -> tuple[tuple[int, int, npt.NDArray[np.float64]], ...]:
    """Per filter: its first and past-last nonzero frequency bin and its weights there.

    The weights are the float32 copy torch multiplies by (the float64 product with those values
    is what its float32 matmul approximates). Each filter spans at most 9 of the 201 bins, so
    summing the bands is 2x faster than the dense product, and in float64 the order is moot.
    """
    filters = mel_filters(num_mel_filters).astype(np.float32).astype(np.float64)
    bands = []
    for column in filters.T:
        nonzero = np.flatnonzero(column)
        lo, hi = int(nonzero[0]), int(nonzero[-1]) + 1
        bands.append((lo, hi, np.ascontiguousarray(column[lo:hi])))
    return tuple(bands)


def log_mel_spectrogram(
    waveform: npt.NDArray[np.floating], num_mel_filters: int
) -> npt.NDArray[np.float32]:
    """[num_mel_filters, len // 160] features of one (already padded) float32 waveform."""
    x = np.asarray(waveform, dtype=np.float32).astype(np.float64)
    if x.ndim != 1 or x.shape[0] <= N_FFT // 2:
        # torch.stft's reflect padding needs more samples than the pad; padded input always has.
        raise ValueError(f"need a 1-D waveform longer than {N_FFT // 2} samples, got {x.shape}")
    padded = np.pad(x, N_FFT // 2, mode="reflect")
    frames = 1 + (padded.shape[0] - N_FFT) // HOP_LENGTH - 1  # the last frame is dropped
    # Frames that start past the last nonzero sample (the 30 s padding of a short clip) are all
    # zeros: their power is exactly 0 in torch too, so their mel energy is exactly 0 (then the
    # 1e-10 floor). Transform only the others.
    nonzero = padded[::-1] != 0
    last = padded.shape[0] - 1 - int(nonzero.argmax())  # argmax stops at the first True
    live = min(frames, last // HOP_LENGTH + 1) if nonzero.any() else 0
    view = np.lib.stride_tricks.as_strided(
        padded,
        shape=(live, N_FFT),
        strides=(HOP_LENGTH * padded.strides[0], padded.strides[0]),
        writeable=False,
    )
    spectrum = np.fft.rfft(view * _hann_window(), axis=1)
    power = np.ascontiguousarray((spectrum.real**2 + spectrum.imag**2).T)  # [201, live]
    mel = np.zeros((num_mel_filters, frames))
    for row, (lo, hi, weights) in enumerate(_filter_bands(num_mel_filters)):
        mel[row, :live] = weights @ power[lo:hi]
    log_spec = np.log10(np.maximum(mel, 1e-10))
    log_spec = np.maximum(log_spec, log_spec.max() - 8.0)
    return ((log_spec + 4.0) / 4.0).astype(np.float32)


@dataclass(frozen=True)
class AudioFeatures:
    """One clip's processor outputs: what the HF processor returns for it, unbatched."""

    input_features: npt.NDArray[np.float32]  # [num_mel_filters, frames]
    feature_attention_mask: npt.NDArray[np.int32]  # [frames]; 1 for frames of real audio

    @property
    def feature_length(self) -> int:
        """Frames of real audio: Omni's `audio_feature_lengths`, the mask's sum for both."""
        return int(self.feature_attention_mask.sum())

    @property
    def num_audio_tokens(self) -> int:
        return audio_token_count(self.feature_length)


def audio_token_count(feature_length: int) -> int:
    """Audio placeholder tokens for `feature_length` mel frames (Qwen2-Audio's encoder lengths:
    a stride-2 convolution, then a stride-2 pooling)."""
    return ((feature_length - 1) // 2 + 1 - 2) // 2 + 1


def pad_or_truncate(
    audio: npt.NDArray[np.floating], *, truncate: bool, chunk_samples: int = CHUNK_SAMPLES
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int32]]:
    """The clip right-padded with zeros to `chunk_samples` (the extractor's `n_samples`: 30 s
    unless its chunk_length says otherwise), or cut to it if `truncate`, and the per-frame
    attention mask, as `padding="max_length"` and `return_attention_mask=True` make them.

    transformers samples the per-sample mask every 160 samples and, when the padded length is
    not a multiple of 160, drops the last entry so it matches the frames kept: for a clip past
    30 s that is not cut, the mask has len // 160 entries, not ceil(len / 160).
    """
    x = np.asarray(audio, dtype=np.float32)
    if x.ndim != 1:
        raise ValueError(f"expected mono audio (1-D), got shape {x.shape}")
    if truncate:
        x = x[:chunk_samples]
    valid = x.shape[0]
    if valid < chunk_samples:
        x = np.pad(x, (0, chunk_samples - valid))
    sample_mask = np.zeros(x.shape[0], dtype=np.int32)
    sample_mask[:valid] = 1
    mask = sample_mask[::HOP_LENGTH]
    if x.shape[0] % HOP_LENGTH:
        mask = mask[:-1]
    return x, np.ascontiguousarray(mask)


def extract_features(
    audio: npt.NDArray[np.floating],
    *,
    num_mel_filters: int,
    truncate: bool,
    chunk_samples: int = CHUNK_SAMPLES,
) -> AudioFeatures:
    """Features and attention mask of one 16 kHz mono clip.

    `truncate`: True for Qwen2-Audio (and Whisper), False for Qwen2.5-Omni, as vLLM calls them.
    `chunk_samples`: the extractor's `n_samples` (chunk_length x 16 kHz), what a clip is padded
    to: 30 s for Qwen2-Audio, 300 s for the released Qwen2.5-Omni.
    """
    padded, mask = pad_or_truncate(audio, truncate=truncate, chunk_samples=chunk_samples)
    return AudioFeatures(log_mel_spectrogram(padded, num_mel_filters), mask)
