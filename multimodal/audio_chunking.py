"""Cut long audio into clips a Whisper-style model takes whole, where vLLM 0.32 cuts them.

vLLM's speech-to-text server (`vllm/multimodal/audio.py`, `split_audio` and
`find_split_point`, called with the model's `SpeechToTextConfig`: 30 s clips, 1 s overlap,
1600-sample windows) walks the 16 kHz samples: a clip that reaches the end is the last one;
otherwise the cut goes at the start of the quietest (lowest RMS) 100 ms window of the second
before the 30 s mark, and the next clip starts there. The windows are those that start at
multiples of the window size from the search start and end strictly before its end (so 9 of
them in the default second, not 10); the first of equally quiet windows wins, and a window
whose energy is NaN is skipped. The RMS is numpy's float32 `(window**2).mean() ** 0.5`, the
same operations vLLM runs, so a tie breaks the same way.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

__all__ = ["find_split_point", "split_audio"]

# vLLM's SpeechToTextConfig defaults, which Whisper keeps (its clip length is the feature
# extractor's chunk_length, 30 s for every released checkpoint).
CLIP_SECONDS = 30
OVERLAP_SECONDS = 1
WINDOW_SAMPLES = 1600


def split_audio(
    samples: npt.NDArray[np.floating],
    sample_rate: int,
    max_clip_seconds: float = CLIP_SECONDS,
    overlap_seconds: float = OVERLAP_SECONDS,
    window: int = WINDOW_SAMPLES,
) -> list[npt.NDArray[np.floating]]:
    """Mono `samples` cut into clips of at most `max_clip_seconds` (views, in order)."""
    if samples.ndim != 1:
        raise ValueError(f"split_audio expects mono audio, got shape {samples.shape}")
    clip = int(sample_rate * max_clip_seconds)
    overlap = int(sample_rate * overlap_seconds)
    total = samples.shape[-1]
    clips, start = [], 0
    while start < total:
        if start + clip >= total:
            clips.append(samples[start:])
            break
        cut = find_split_point(samples, start + clip - overlap, min(start + clip, total), window)
        if cut <= start:  # no progress (an overlap as long as the clip): cut at the mark
            cut = min(start + clip, total)
        clips.append(samples[start:cut])
        start = cut
    return clips


def find_split_point(samples: npt.NDArray[np.floating], start: int, end: int, window: int) -> int:
    """The start of the quietest `window`-sample stretch in samples[start:end] (`start` when
    none fits)."""
    segment = samples[start:end]
    quietest, lowest = start, math.inf
    for offset in range(0, len(segment) - window, window):
        energy = (segment[offset : offset + window] ** 2).mean() ** 0.5
        if not math.isnan(energy) and energy < lowest:
            quietest, lowest = offset + start, energy
    return quietest
