"""Time multimodal.audio_features and multimodal.audio_resample against what vLLM runs.

    python -m benchmarks.audio_features_bench [--repeats 15]

References: transformers' WhisperFeatureExtractor (its torch path, as in vLLM: 128 mel bins,
padding to 30 s, attention mask) and torchaudio's Resample transform to 16 kHz (vLLM's
`resample_audio_torchaudio`, kernel cached as vLLM caches it). Everything runs single-threaded
(torch.set_num_threads(1); OPENBLAS_NUM_THREADS defaults to 1). Reports the fastest and the
median run in ms, the ratio ours / reference of the medians (below 1: we are faster) and the
largest absolute difference from the reference.
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


def timed(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    fn()  # warm caches (kernels, filters, FFT plans)
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - start) * 1e3)
    return min(runs), statistics.median(runs)


def clip(rate: int, seconds: float) -> np.ndarray:
    rng = np.random.default_rng(rate)
    t = np.arange(int(rate * seconds)) / rate
    return (0.5 * np.sin(2 * np.pi * 440 * t) + 0.1 * rng.uniform(-1, 1, t.size)).astype(np.float32)


def row(name: str, ours: tuple[float, float], ref: tuple[float, float], err: float) -> None:
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
    extractor = WhisperFeatureExtractor(feature_size=128)

    print(f"single thread, ms (min / median of {args.repeats} runs); ratio = ours / reference")
    print(
        f"{'case':28} {'ours min':>8} {'median':>8} {'ref min':>8} {'median':>8} {'ratio':>8}"
        f" {'max |diff|':>10}"
    )
    for seconds in (5.0, 30.0):
        audio = clip(16000, seconds)

        def reference(audio: np.ndarray = audio) -> np.ndarray:
            out = extractor(
                [audio],
                sampling_rate=16000,
                padding="max_length",
                truncation=True,
                return_attention_mask=True,
                return_tensors="np",
            )
            return out["input_features"][0]

        def ours(audio: np.ndarray = audio) -> np.ndarray:
            return extract_features(audio, num_mel_filters=128, truncate=True).input_features

        err = float(np.abs(ours() - reference()).max())
        row(
            f"features {seconds:g} s",
            timed(ours, args.repeats),
            timed(reference, args.repeats),
            err,
        )

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
            row(
                f"resample {rate} Hz {seconds:g} s",
                timed(ours, args.repeats),
                timed(reference, args.repeats),
                err,
            )


if __name__ == "__main__":
    main()
