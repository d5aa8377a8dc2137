"""Resampling to the model's rate as vLLM's chat path does it, without torch.

vLLM 0.32 resamples decoded audio with `torchaudio.transforms.Resample(orig_sr, target_sr)` at
its defaults (windowed-sinc, Hann window, lowpass_filter_width 6, rolloff 0.99) on a float32
tensor (vllm/multimodal/audio.py `resample_audio_torchaudio`). This module builds the same
polyphase kernel and applies it the same way (padding, stride, output length), so the samples
equal torchaudio's to float32 rounding: the kernel is bit-identical, only the order of the
float32 multiply-adds in the convolution differs (see `resample`). It is as fast as torchaudio or
faster: the convolution is one BLAS matrix product over a strided view.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import numpy.typing as npt

LOWPASS_FILTER_WIDTH = 6
ROLLOFF = 0.99


@lru_cache(maxsize=32)
def sinc_kernel(orig_freq: int, new_freq: int) -> tuple[npt.NDArray[np.float32], int]:
    """The polyphase kernel [new, 2*width + orig] (gcd-reduced rates) and its half-width.

    A transcription of torchaudio's `_get_sinc_resample_kernel` as the `Resample` transform
    calls it (dtype None): the time grid is float64 except the per-phase offset j/new, which
    torch computes as an int64 tensor divided by an int, i.e. in float32 (the default dtype),
    before adding it to the float64 grid. The kernel is computed in float64 and cast to float32.
    """
    gcd = math.gcd(orig_freq, new_freq)
    orig, new = orig_freq // gcd, new_freq // gcd
    base_freq = min(orig, new) * ROLLOFF
    width = math.ceil(LOWPASS_FILTER_WIDTH * orig / base_freq)
    idx = np.arange(-width, width + orig, dtype=np.float64)[None, :] / orig
    phase = np.arange(0, -new, -1, dtype=np.float32)[:, None] / np.float32(new)
    t = phase.astype(np.float64) + idx
    t *= base_freq
    np.clip(t, -LOWPASS_FILTER_WIDTH, LOWPASS_FILTER_WIDTH, out=t)
    window = np.cos(t * math.pi / LOWPASS_FILTER_WIDTH / 2) ** 2
    t *= math.pi
    scale = base_freq / orig
    with np.errstate(divide="ignore", invalid="ignore"):
        kernels = np.where(t == 0, 1.0, np.sin(t) / t)
    kernels *= window * scale
    kernel = kernels.astype(np.float32)
    kernel.flags.writeable = False
    return kernel, width


def output_length(length: int, orig_freq: int, new_freq: int) -> int:
    """Samples `resample` returns for `length` input samples.

    torchaudio takes ceil(new * length / orig) on the gcd-reduced rates, with the quotient put in
    a float32 tensor first: past ~65,536 output samples a quotient just above an integer rounds
    down to it, so the ceiling is one short of the exact one (44.1 kHz input, for one).
    """
    gcd = math.gcd(orig_freq, new_freq)
    orig, new = orig_freq // gcd, new_freq // gcd
    return int(np.ceil(np.float32(new * length / orig)))


def resample(
    audio: npt.NDArray[np.floating], orig_freq: int, new_freq: int
) -> npt.NDArray[np.float32]:
    """`audio` (..., samples) at `orig_freq` Hz, as float32 at `new_freq` Hz.

    The input is cast to float32 first, as vLLM does before calling torchaudio. The convolution
    is a strided view of the padded signal (one row per output frame of `new` samples) times the
    kernel, in float32 like torch's conv1d; the two sum the taps in different orders, so a sample
    may differ in its last bits (measured: at most ~3e-7 on full-scale noise). Summing in float64
    instead is no closer to torch and 2-5x slower.
    """
    x = np.asarray(audio, dtype=np.float32)
    if orig_freq == new_freq:
        return x
    if orig_freq <= 0 or new_freq <= 0:
        raise ValueError(f"sample rates must be positive, got {orig_freq} -> {new_freq}")
    kernel, width = sinc_kernel(orig_freq, new_freq)
    gcd = math.gcd(orig_freq, new_freq)
    orig = orig_freq // gcd
    shape = x.shape
    rows = x.reshape(-1, shape[-1])
    length = shape[-1]
    padded = np.zeros((rows.shape[0], length + 2 * width + orig), dtype=np.float32)
    padded[:, width : width + length] = rows
    taps = kernel.shape[1]
    frames = length // orig + 1
    view = np.lib.stride_tricks.as_strided(
        padded,
        shape=(rows.shape[0], frames, taps),
        strides=(padded.strides[0], orig * padded.strides[1], padded.strides[1]),
        writeable=False,
    )
    out = view @ kernel.T  # (rows, frames, new): frame-major, phase-minor, as torch interleaves
    out = out.reshape(rows.shape[0], -1)[:, : output_length(length, orig_freq, new_freq)]
    return np.ascontiguousarray(out).reshape(shape[:-1] + out.shape[-1:])
