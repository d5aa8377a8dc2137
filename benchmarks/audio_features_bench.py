"""Time multimodal.audio_features and multimodal.audio_resample against what vLLM runs.

    python -m benchmarks.audio_features_bench [--repeats 15]

References: transformers' WhisperFeatureExtractor (its torch path, as in vLLM: 128 mel bins,
attention mask) as Qwen2-Audio's processor calls it (padding to 30 s, truncation) and as
Qwen2.5-Omni's does (chunk_length 300: padding to 300 s, no truncation), and torchaudio's
Resample transform to 16 kHz (vLLM's `resample_audio_torchaudio`, kernel cached as vLLM caches
it). Everything runs single-threaded (torch.set_num_threads(1); OPENBLAS_NUM_THREADS defaults
to 1). Ours and the reference run alternately, so load on a shared machine hits both alike.
Reports the fastest and the median run in ms, the ratio ours / reference of the medians (below
1: we are faster) and the largest absolute difference from the reference.
"""

from __future__ import annotations

import os

# Must precede the numpy import: OpenBLAS reads it once, when loaded.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

import numpy as np  # noqa: E402

from multimodal.audio_features import extract_features  # noqa: E402
from multimodal.audio_resample import resample  # noqa: E402

Timing = tuple[float, float]  # fastest and median run, ms


def timed(
    ours: Callable[[], object], reference: Callable[[], object], repeats: int
) -> tuple[Timing, Timing]:
    """Both functions' timings, their runs interleaved (a warm-up of each first: kernels,
    filters, FFT plans)."""
    runs: tuple[list[float], list[float]] = ([], [])
    ours()
    reference()
    for _ in range(repeats):
        for fn, out in ((ours, runs[0]), (reference, runs[1])):
            start = time.perf_counter()
            fn()
            out.append((time.perf_counter() - start) * 1e3)
    return tuple((min(r), statistics.median(r)) for r in runs)  # type: ignore[return-value]


def clip(rate: int, seconds: float) -> np.ndarray:
    rng = np.random.default_rng(rate)
    t = np.arange(int(rate * seconds)) / rate
    return (0.5 * np.sin(2 * np.pi * 440 * t) + 0.1 * rng.uniform(-1, 1, t.size)).astype(np.float32)


def row(name: str, ours: Timing, ref: Timing, err: float) -> None:
    print(
        f"{name:28} {ours[0]:8.2f} {ours[1]:8.2f} {ref[0]:8.2f} {ref[1]:8.2f}"
        f" {ours[1] / ref[1]:7.2f}x {err:10.1e}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()

    import torch
    import torchaudio
    from transformers import WhisperFeatureExtractor

    torch.set_num_threads(1)
    # (case, seconds, the extractor's chunk_length, truncation) as each family's processor runs it
    feature_cases = [
        ("qwen2_audio", 5.0, 30, True),
        ("qwen2_audio", 30.0, 30, True),
        ("omni (300 s)", 5.0, 300, False),
        ("omni (300 s)", 31.0, 300, False),
    ]
    extractors = {n: WhisperFeatureExtractor(feature_size=128, chunk_length=n) for n in (30, 300)}

    print(f"single thread, ms (min / median of {args.repeats} runs); ratio = ours / reference")
    print(
        f"{'case':28} {'ours min':>8} {'median':>8} {'ref min':>8} {'median':>8} {'ratio':>8}"
        f" {'max |diff|':>10}"
    )
    for family, seconds, chunk_length, truncate in feature_cases:
        audio = clip(16000, seconds)
        extractor = extractors[chunk_length]

        def reference(
            audio: np.ndarray = audio, extractor=extractor, truncate: bool = truncate
        ) -> np.ndarray:
            out = extractor(
                [audio],
                sampling_rate=16000,
                padding="max_length",
                truncation=truncate,
                return_attention_mask=True,
                return_tensors="np",
            )
            return out["input_features"][0]

        def ours(
            audio: np.ndarray = audio, chunk_length: int = chunk_length, truncate: bool = truncate
        ) -> np.ndarray:
            return extract_features(
                audio,
                num_mel_filters=128,
                truncate=truncate,
                chunk_samples=chunk_length * 16000,
            ).input_features

        err = float(np.abs(ours() - reference()).max())
        row(f"{family} {seconds:g} s", *timed(ours, reference, args.repeats), err)

    for rate in (8000, 22050, 24000, 44100, 48000):
        resampler = torchaudio.transforms.Resample(rate, 16000)
        for seconds in (5.0, 30.0):
            audio = clip(rate, seconds)

            def reference(audio: np.ndarray = audio, resampler=resampler) -> np.ndarray:
                with torch.backends.mkldnn.flags(enabled=False):  # as vLLM runs it
                    return resampler(torch.as_tensor(audio)).numpy()

            def ours(audio: np.ndarray = audio, rate: int = rate) -> np.ndarray:
                return resample(audio, rate, 16000)

            err = float(np.abs(ours() - reference()).max())
            row(f"resample {rate} Hz {seconds:g} s", *timed(ours, reference, args.repeats), err)


if __name__ == "__main__":
    main()
