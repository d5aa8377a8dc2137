"""Check a client-supplied audio clip before anything uses it: bytes, container, header, samples.

vLLM 0.32 takes an audio item as an `audio_url` (http(s), data: or file: URL) or an
`input_audio` part (`{"data": base64, "format": ...}`, which it turns into
``data:audio/<format>;base64,<data>``). Either way its loader ignores the declared type and
hands the bytes to torchcodec, libsndfile or FFmpeg, whichever opens them; its only limits are
environment variables (25 MiB encoded, 600 s, 256 MiB of decoded PCM). The gateway refuses, with
a 400 naming the clip ("audio 1: ..."), what the operator does not allow or what would not
decode:

- the encoded bytes, at most ``MediaPolicy.max_audio_bytes`` (``--max-audio-bytes``), under
  the image rules for where they come from (address checks, domains, local root);
- a container sniffed from the bytes, never from the declared type: WAV (RIFF/RF64), FLAC,
  MP3 (MPEG audio frames, after any ID3v2 tags) or Ogg (Vorbis, Opus, FLAC) — the formats
  OpenAI-style clients send; libsndfile's and FFmpeg's other demuxers stay out of reach;
- its header (read without decoding, by libsndfile, or by FFmpeg where libsndfile gives up as
  vLLM's loader does): a sample rate up to ``max_audio_sample_rate``, at most
  ``max_audio_channels`` channels, ``max_audio_seconds`` and ``max_audio_decoded_bytes`` of
  float32 PCM;
- then the clip decoded as vLLM's loader decodes it (``multimodal.audio_decode``), the same
  limits held against the samples themselves (a header may lie), and the decoding time against
  ``audio_decode_timeout``, checked between blocks of samples (libsndfile) or frames (FFmpeg),
  so a clip that decodes too slowly is cut off, not decoded to the end.

Blocking: call these off the event loop.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from io import BytesIO

import pybase64

from multimodal.audio_decode import (
    AudioDecodeError,
    AudioDecodeTimeout,
    AudioTooLarge,
    DecodedAudio,
    decode_audio,
)
from multimodal.errors import MediaDecodeError, MediaTooLargeError
from multimodal.media import source_bytes
from multimodal.policy import MediaPolicy

__all__ = ["AudioInfo", "LoadedAudio", "checked_audio", "load_audio", "probe_audio", "sniff_audio"]

_FORMATS = "WAV, FLAC, MP3 or Ogg"
# libsndfile error codes after which vLLM's loader tries FFmpeg (its `_BAD_SF_CODES`).
_SOUNDFILE_DEFERS = {0, 1, 3, 4}
_PCM_BYTES = 4  # float32, what vLLM's loader decodes to
_ID3_TAGS = 4  # ID3v2 tags skipped before the first MPEG frame, at most


@dataclass(frozen=True)
class AudioInfo:
    """What a clip's header says (nothing decoded); `seconds` is None if it does not say."""

    sample_rate: int
    channels: int
    seconds: float | None


@dataclass(frozen=True, eq=False)
class LoadedAudio:
    """A decoded clip and the exact bytes it came from (the input of its hash)."""

    audio: DecodedAudio
    data: bytes
    mime: str  # sniffed from the bytes

    def data_url(self) -> str:
        return f"data:{self.mime};base64,{pybase64.b64encode(self.data).decode('ascii')}"


def checked_audio(source: str, raw: bytes | None, policy: MediaPolicy) -> str:
    """Blocking: the ``data:`` URL a worker gets for one audio source, after every check above
    (the clip decoded once here, so that what the worker decodes is known to decode).
    ``raw``: the downloaded bytes of an http(s) source, None for the others."""
    return load_audio(source, raw, policy).data_url()


def load_audio(source: str, raw: bytes | None, policy: MediaPolicy) -> LoadedAudio:
    """Blocking: one audio source's bytes, checked, and decoded at its own rate as vLLM's
    loader decodes it."""
    data, _ = source_bytes(source, raw, policy.for_audio())
    mime = sniff_audio(data)
    if mime is None:
        raise MediaDecodeError(f"not a supported audio format ({_FORMATS})", kind="audio")
    _check_header(probe_audio(data), policy)
    started = time.monotonic()
    try:
        decoded = decode_audio(
            data,
            max_duration_s=policy.max_audio_seconds,
            max_decode_bytes=policy.max_audio_decoded_bytes,
            deadline=started + policy.audio_decode_timeout,
        )
    except AudioDecodeTimeout:
        raise _too_slow(policy) from None
    except AudioTooLarge as error:
        raise MediaTooLargeError(str(error), kind="audio") from None
    except (AudioDecodeError, ValueError, RuntimeError):
        # The libraries' own messages can hold paths and internals; a client needs only this.
        raise MediaDecodeError("invalid or corrupted audio data", kind="audio") from None
    elapsed = time.monotonic() - started
    _check_decoded(decoded, policy)
    if elapsed > policy.audio_decode_timeout:
        raise _too_slow(policy)
    return LoadedAudio(decoded, data, mime)


def _too_slow(policy: MediaPolicy) -> MediaTooLargeError:
    return MediaTooLargeError(
        f"decoding the audio took longer than the {policy.audio_decode_timeout:g} s limit",
        kind="audio",
    )


def sniff_audio(data: bytes) -> str | None:
    """The MIME type of the audio container the bytes start with, None if not one we take."""
    if data[:4] in (b"RIFF", b"RF64", b"BW64") and data[8:12] == b"WAVE":
        return "audio/wav"
    if data[:4] == b"OggS":
        return "audio/ogg"
    body = _after_id3(data)
    if body is None:
        return None
    if body[:4] == b"fLaC":
        return "audio/flac"
    if _is_mpeg_frame(body[:4]):
        return "audio/mpeg"
    return None


def _after_id3(data: bytes) -> bytes | None:
    """`data` past its leading ID3v2 tags (MP3s, and some FLACs, start with one); None if a
    tag runs past the end or there are too many."""
    offset = 0
    for _ in range(_ID3_TAGS):
        header = data[offset : offset + 10]
        if header[:3] != b"ID3":
            return data[offset:]
        if len(header) < 10 or any(b & 0x80 for b in header[6:10]):
            return None
        # "syncsafe": four bytes of seven bits each
        size = header[6] << 21 | header[7] << 14 | header[8] << 7 | header[9]
        offset += 10 + size + (10 if header[5] & 0x10 else 0)  # a footer repeats the header
        if offset >= len(data):
            return None
    return None


def _is_mpeg_frame(header: bytes) -> bool:
    """An MPEG-1/2/2.5 audio frame header, layer I-III (not AAC's ADTS, which shares the sync)."""
    if len(header) < 4 or header[0] != 0xFF or header[1] & 0xE0 != 0xE0:
        return False
    version, layer = header[1] >> 3 & 3, header[1] >> 1 & 3
    bitrate, rate = header[2] >> 4, header[2] >> 2 & 3
    return version != 1 and layer != 0 and bitrate != 15 and rate != 3


def probe_audio(data: bytes) -> AudioInfo:
    """The rate, channels and length the header states, read by libsndfile or, for what
    libsndfile does not recognise (the codes after which vLLM's loader tries FFmpeg), by
    FFmpeg. Decodes nothing."""
    import soundfile

    try:
        with soundfile.SoundFile(BytesIO(data)) as f:
            rate, channels, frames = int(f.samplerate), int(f.channels), int(f.frames)
        return AudioInfo(rate, channels, frames / rate if rate > 0 else None)
    except soundfile.LibsndfileError as error:
        if error.code not in _SOUNDFILE_DEFERS:
            raise MediaDecodeError("invalid or corrupted audio data", kind="audio") from None
    except (ValueError, RuntimeError):
        raise MediaDecodeError("invalid or corrupted audio data", kind="audio") from None
    return _probe_pyav(data)


def _probe_pyav(data: bytes) -> AudioInfo:
    import av

    try:
        with av.open(BytesIO(data)) as container:
            if not container.streams.audio:
                raise MediaDecodeError("the file holds no audio stream", kind="audio")
            stream = container.streams.audio[0]
            seconds = None
            if stream.duration and stream.time_base:
                seconds = float(stream.duration * stream.time_base)
            elif container.duration:
                seconds = container.duration / 1_000_000
            return AudioInfo(int(stream.rate or 0), int(stream.channels or 0), seconds)
    except (av.error.FFmpegError, ValueError, RuntimeError):
        raise MediaDecodeError("invalid or corrupted audio data", kind="audio") from None


def _check_header(info: AudioInfo, policy: MediaPolicy) -> None:
    if info.sample_rate <= 0 or info.channels <= 0:
        raise MediaDecodeError("the audio header states no sample rate or channels", kind="audio")
    _check_rate_and_channels(info.sample_rate, info.channels, policy)
    if info.seconds is not None:
        _check_length(info.seconds, policy)
        pcm = round(info.seconds * info.sample_rate) * info.channels * _PCM_BYTES
        _check_pcm(pcm, policy)


def _check_decoded(decoded: DecodedAudio, policy: MediaPolicy) -> None:
    samples = decoded.samples
    if samples.size == 0:
        raise MediaDecodeError("the audio holds no samples", kind="audio")
    _check_rate_and_channels(decoded.sample_rate, decoded.channels, policy)
    _check_length(samples.shape[-1] / decoded.sample_rate, policy)
    _check_pcm(samples.size * _PCM_BYTES, policy)


def _check_rate_and_channels(rate: int, channels: int, policy: MediaPolicy) -> None:
    if rate > policy.max_audio_sample_rate:
        raise MediaTooLargeError(
            f"the audio's sample rate is {rate} Hz, above the {policy.max_audio_sample_rate} Hz "
            "limit",
            kind="audio",
        )
    if channels > policy.max_audio_channels:
        raise MediaTooLargeError(
            f"the audio has {channels} channels, above the {policy.max_audio_channels} channel "
            "limit",
            kind="audio",
        )


def _check_length(seconds: float, policy: MediaPolicy) -> None:
    if seconds > policy.max_audio_seconds:
        raise MediaTooLargeError(
            f"the audio lasts {seconds:.1f} s, above the {policy.max_audio_seconds:g} s limit",
            kind="audio",
        )


def _check_pcm(size: int, policy: MediaPolicy) -> None:
    if size > policy.max_audio_decoded_bytes:
        limit = policy.max_audio_decoded_bytes / (1 << 20)
        raise MediaTooLargeError(
            f"the audio decodes to {size / (1 << 20):.0f} MiB of samples, above the {limit:g} "
            "MiB limit",
            kind="audio",
        )
