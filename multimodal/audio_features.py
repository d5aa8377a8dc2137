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

The padding is never built: a frame whose window holds only zeros has the floor's value (then
the clamp), so only the frames up to the last that touches a nonzero sample are transformed.
For Omni's 300 s that cut a 5 s clip from ~45 ms (mostly log10 and temporaries over 30,000
frames) to ~1 ms (benchmarks/RESULTS.md, "Audio features").
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


def _last_nonzero(clip: npt.NDArray[np.float32]) -> int:
    """Index of the clip's last nonzero sample, -1 if it is all zeros."""
    nonzero = clip[::-1] != 0
    return clip.shape[0] - 1 - int(nonzero.argmax()) if nonzero.any() else -1


def _live_log_mel(
    clip: npt.NDArray[np.float32], total: int, num_mel_filters: int
) -> npt.NDArray[np.float64]:
    """log10 mel energies (floored at 1e-10) [bins, live] of the first frames of `clip`
    zero-padded to `total` samples, up to the last that touches a nonzero sample.

    Frame f is the window over samples [160 f - 200, 160 f + 200) of the reflect-padded signal.
    Once a frame starts past the last nonzero sample it sees zeros only, up to the end: the
    reflection at the end mirrors the signal's last 200 samples, which are then zeros too (a
    frame near the end can only see a nonzero through it if that sample is within 201 of the
    end, and then every frame is live). An all-zero frame's power is exactly 0 in torch too,
    so such frames are left out here and their value is the 1e-10 floor: log10 = -10.
    """
    frames = total // HOP_LENGTH  # 1 + total // 160 frames of the padded STFT, the last dropped
    last = _last_nonzero(clip)
    live = 0 if last < 0 else min(frames, (last + N_FFT // 2) // HOP_LENGTH + 1)
    if live == 0:
        return np.zeros((num_mel_filters, 0))
    # Only the samples the live frames reach (and the rest of one more hop, harmlessly).
    span = min(total, live * HOP_LENGTH + N_FFT)
    signal = np.zeros(span)
    kept = min(span, clip.shape[0])
    signal[:kept] = clip[:kept]
    # Reflect at the start always; at the end only if the span reaches it (else no live
    # frame reads past the span's end: see above).
    signal = np.pad(signal, (N_FFT // 2, N_FFT // 2 if span == total else 0), mode="reflect")
    view = np.lib.stride_tricks.as_strided(
        signal,
        shape=(live, N_FFT),
        strides=(HOP_LENGTH * signal.strides[0], signal.strides[0]),
        writeable=False,
    )
    spectrum = np.fft.rfft(view * _hann_window(), axis=1)
    power = np.ascontiguousarray((spectrum.real**2 + spectrum.imag**2).T)  # [201, live]
    mel = np.empty((num_mel_filters, live))
    for row, (lo, hi, weights) in enumerate(_filter_bands(num_mel_filters)):
        mel[row] = weights @ power[lo:hi]
    np.maximum(mel, 1e-10, out=mel)
    return np.log10(mel, out=mel)


@dataclass(frozen=True)
class AudioFeatures:
    """One clip's processor outputs: what the HF processor returns for it, unbatched.

    The features are held as the frames that touch real samples (`live`) and the one value of
    every frame after them (`fill`: all-zero input, so the floor, clamped): Omni pads every clip
    to 300 s, 30,000 frames, and sends only the real ones; building them all (15 MB of float32
    for a 5 s clip) was most of its cost. `input_features` builds the full array.
    """

    live: npt.NDArray[np.float32]  # [num_mel_filters, live frames]
    fill: np.float32  # every frame after `live`
    feature_attention_mask: npt.NDArray[np.int32]  # [frames]; 1 for frames of real audio

    @property
    def frames(self) -> int:
        return self.feature_attention_mask.shape[0]

    @property
    def input_features(self) -> npt.NDArray[np.float32]:
        """[num_mel_filters, frames]: the extractor's `input_features` for the clip."""
        return self.first_frames(self.frames)

    def first_frames(self, count: int) -> npt.NDArray[np.float32]:
        """[num_mel_filters, count]: the first `count` frames (a new array)."""
        out = np.empty((self.live.shape[0], count), dtype=np.float32)
        head = min(count, self.live.shape[1])
        out[:, :head] = self.live[:, :head]
        out[:, head:] = self.fill
        return out

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


def padded_length(samples: int, *, truncate: bool, chunk_samples: int = CHUNK_SAMPLES) -> int:
    """The samples a clip of `samples` becomes under `padding="max_length"` to the extractor's
    `n_samples` (`chunk_samples`: 30 s unless its chunk_length says otherwise): exactly that
    if `truncate`, else at least that (a longer clip is kept whole)."""
    return chunk_samples if truncate else max(samples, chunk_samples)


def attention_mask(samples: int, total: int) -> npt.NDArray[np.int32]:
    """The per-frame mask `return_attention_mask=True` gives for `samples` real samples padded
    (or cut) to `total`.

    transformers samples its per-sample mask every 160 samples (entry k is sample 160 k's) and,
    when `total` is not a multiple of 160, drops the last entry so it matches the frames kept:
    total // 160 entries either way (for a clip past 30 s that is not cut, not ceil(len / 160)),
    the first ceil(samples / 160) of them ones.
    """
    mask = np.zeros(total // HOP_LENGTH, dtype=np.int32)
    mask[: -(-samples // HOP_LENGTH)] = 1
    return mask


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
    to: 30 s for Qwen2-Audio, 300 s for the released Qwen2.5-Omni. The padding itself is never
    built: only the frames that touch real samples are transformed.
    """
    clip = np.asarray(audio, dtype=np.float32)
    if clip.ndim != 1:
        raise ValueError(f"expected mono audio (1-D), got shape {clip.shape}")
    total = padded_length(clip.shape[0], truncate=truncate, chunk_samples=chunk_samples)
    if total <= N_FFT // 2:
        # torch.stft's reflect padding needs more samples than the pad; padded input always has.
        raise ValueError(f"need more than {N_FFT // 2} samples after padding, got {total}")
    clip = clip[:total]
    log_mel = _live_log_mel(clip, total, num_mel_filters)
    # The clamp is per clip, over every frame: the padding's -10 counts when there is padding
    # (it can only lower the max when nothing is live, where the max is that -10).
    top = float(log_mel.max()) if log_mel.size else -10.0
    floor = top - 8.0
    np.maximum(log_mel, floor, out=log_mel)
    live = ((log_mel + 4.0) / 4.0).astype(np.float32)
    fill = np.float32((max(-10.0, floor) + 4.0) / 4.0)
    return AudioFeatures(live, fill, attention_mask(clip.shape[0], total))
