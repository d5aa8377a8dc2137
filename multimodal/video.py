"""Check a client-supplied video before a worker decodes it: bytes, container, frames.

Two uses: for a model whose videos the gateway preprocesses, `load_video` decodes the frames
the family's loader picks (`VideoProcessor.pick_frames`); for the others a worker started with
`--mm-processor inprocess` runs vLLM's own loader, and `checked_video` gives it exactly the
checked bytes. Both refuse, with a 400 naming the clip, what vLLM's loader would choke on or
what the operator does not allow:

- a container vLLM's OpenCV loader reads (MP4/QuickTime, Matroska/WebM, AVI), sniffed from the
  bytes, at most ``MediaPolicy.max_video_bytes`` (``--max-video-bytes``);
- that OpenCV opens from memory, as vLLM does, with at least two frames (vLLM's loader seeks
  to the end to correct the frame count, after which it cannot read a one-frame clip's only
  frame and fails) of at most ``max_pixels`` each, and at most ``max_video_frames`` frames
  and ``max_video_seconds`` seconds as the container states them; the gateway's own decoding
  stops at ``video_decode_timeout``;
- or vLLM's frame list ``data:video/jpeg;base64,<frame>,<frame>,...``: every frame an image
  whose header passes the image rules, all of them within the byte limit.

Reading the header opens the clip with OpenCV (FFmpeg) but decodes no frame. Blocking: call
both off the event loop.
"""

from __future__ import annotations

import binascii
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pybase64

from multimodal.decode import check_header, decode_pixels
from multimodal.errors import MediaDecodeError, MediaSourceError, MediaTooLargeError
from multimodal.media import source_bytes
from multimodal.policy import MediaPolicy, byte_limit_error
from multimodal.video_decode import (
    DecodedClip,
    TooManyPixels,
    decode_picked_frames,
    open_capture,
)

__all__ = [
    "FRAME_LIST_MIME",
    "LoadedVideo",
    "VideoInfo",
    "VideoSource",
    "checked_video",
    "load_video",
    "probe_video",
    "read_video",
    "sniff_container",
]

FRAME_LIST_MIME = "video/jpeg"  # vLLM's name for a list of base64 frames in one data: URL
# vLLM's VideoMediaIO keeps the first num_frames (32 unless --media-io-kwargs says otherwise)
# frames of a frame list, whatever the model's loader.
FRAME_LIST_FRAMES = 32
# pick(total_frames, fps) -> the source frames to keep (VideoProcessor.pick_frames).
FramePicker = Callable[[int, float], list[int]]


@dataclass(frozen=True)
class FrameListSampling:
    """How vLLM loads a frame list: its first `num_frames` frames, at `fps` (its
    media_io_kwargs' num_frames and fps, 32 and 1 by default)."""

    num_frames: int = FRAME_LIST_FRAMES
    fps: float = 1.0


@dataclass(frozen=True, eq=False)
class LoadedVideo:
    """A clip's decoded frames and the exact bytes it came from (the input of its hash)."""

    clip: DecodedClip
    data: bytes
    mime: str  # sniffed: the container's type, or video/jpeg for a frame list

    @property
    def pixels(self) -> DecodedClip:
        """What the family's VideoProcessor.process takes."""
        return self.clip


_CONTAINERS = "MP4, MOV, WebM, MKV or AVI"


@dataclass(frozen=True)
class VideoInfo:
    """What the container says about a clip (nothing decoded)."""

    frames: int
    width: int
    height: int
    fps: float


def checked_video(source: str, raw: bytes | None, policy: MediaPolicy) -> str:
    """Blocking: the ``data:`` URL a worker gets for one video source, after the checks
    above. ``raw``: the downloaded bytes of an http(s) source, None for the others.
    ``policy`` is the request's (its video byte limit applies here)."""
    video_policy = policy.for_video()
    if raw is None and _is_frame_list(source):
        return _checked_frame_list(source, video_policy)
    data, _ = source_bytes(source, raw, video_policy)
    mime = sniff_container(data)
    if mime is None:
        raise MediaDecodeError(f"not a supported video container ({_CONTAINERS})", kind="video")
    info = probe_video(data)
    _check_info(info, policy)
    return f"data:{mime};base64,{pybase64.b64encode(data).decode('ascii')}"


def load_video(
    source: str,
    raw: bytes | None,
    policy: MediaPolicy,
    pick: FramePicker,
    frame_list: FrameListSampling = FrameListSampling(),
) -> LoadedVideo:
    """Blocking: the frames of one video source that `pick` chooses, decoded as vLLM's OpenCV
    loader decodes them, after the checks above. A frame list is taken as vLLM takes it: its
    first `frame_list.num_frames` frames (32) at `frame_list.fps` (1)."""
    return read_video(source, raw, policy).load(pick, frame_list)


@dataclass(frozen=True)
class VideoSource:
    """A video's bytes, read (and a frame list's frames checked) but nothing decoded: `data`
    is what its hash covers, so the media cache can be asked before decoding."""

    data: bytes  # a container's bytes, or a frame list's checked data URL
    policy: MediaPolicy
    frame_list: bool

    def load(self, pick: FramePicker, sampling: FrameListSampling) -> LoadedVideo:
        """Blocking: `load_video`'s decoding, from here."""
        if self.frame_list:
            return _decoded_frame_list(self.data.decode(), self.policy, sampling)
        return _decoded_container(self.data, self.policy, pick)


def read_video(source: str, raw: bytes | None, policy: MediaPolicy) -> VideoSource:
    """Blocking: one video source's bytes under the policy's byte and path rules."""
    video_policy = policy.for_video()
    if raw is None and _is_frame_list(source):
        checked = _checked_frame_list(source, video_policy)
        return VideoSource(checked.encode(), policy, True)
    data, _ = source_bytes(source, raw, video_policy)
    return VideoSource(data, policy, False)


def _decoded_container(data: bytes, policy: MediaPolicy, pick: FramePicker) -> LoadedVideo:
    mime = sniff_container(data)
    if mime is None:
        raise MediaDecodeError(f"not a supported video container ({_CONTAINERS})", kind="video")
    _check_info(probe_video(data), policy)
    deadline = time.monotonic() + policy.video_decode_timeout
    try:
        clip = decode_picked_frames(data, pick, deadline, policy.max_video_decoded_bytes)
    except TooManyPixels as error:
        raise MediaTooLargeError(str(error), kind="video") from None
    except TimeoutError:
        raise MediaTooLargeError(
            f"decoding the video took longer than the {policy.video_decode_timeout:g} s limit",
            kind="video",
        ) from None
    except ValueError as error:  # the loader cannot sample the clip, or OpenCV cannot open it
        raise MediaDecodeError(str(error), kind="video") from None
    if not clip.indices:
        raise MediaDecodeError("none of the video's frames could be decoded", kind="video")
    return LoadedVideo(clip, data, mime)


def _decoded_frame_list(
    checked: str, policy: MediaPolicy, sampling: FrameListSampling
) -> LoadedVideo:
    encoded = checked.partition(",")[2].split(",")[: sampling.num_frames]
    frames = [np.asarray(decode_pixels(pybase64.b64decode(f), policy)[0]) for f in encoded]
    if len({f.shape for f in frames}) > 1:
        raise MediaDecodeError("the frames of a frame list must all have one size", kind="video")
    count = len(frames)
    clip = DecodedClip(np.stack(frames), list(range(count)), count, sampling.fps, frame_list=True)
    return LoadedVideo(clip, checked.encode(), FRAME_LIST_MIME)


def sniff_container(data: bytes) -> str | None:
    """The MIME type of the container the bytes start with, None if not one we take."""
    if data[4:8] == b"ftyp":
        return "video/quicktime" if data[8:12] == b"qt  " else "video/mp4"
    if data[:4] == b"\x1a\x45\xdf\xa3":  # EBML: Matroska, or WebM if its doctype says so
        return "video/webm" if b"webm" in data[:64] else "video/x-matroska"
    if data[:4] == b"RIFF" and data[8:12] == b"AVI ":
        return "video/x-msvideo"
    return None


def probe_video(data: bytes) -> VideoInfo:
    """The frame count, size and rate OpenCV reads from the container in memory, opened as
    vLLM opens it (`video_decode.open_capture`)."""
    import cv2

    try:
        with open_capture(data) as capture:
            return VideoInfo(
                frames=int(capture.get(cv2.CAP_PROP_FRAME_COUNT)),
                width=int(capture.get(cv2.CAP_PROP_FRAME_WIDTH)),
                height=int(capture.get(cv2.CAP_PROP_FRAME_HEIGHT)),
                fps=float(capture.get(cv2.CAP_PROP_FPS)),
            )
    except ValueError as error:
        raise MediaDecodeError(str(error), kind="video") from None


def _check_info(info: VideoInfo, policy: MediaPolicy) -> None:
    if info.width <= 0 or info.height <= 0:
        raise MediaDecodeError("the video has no readable frames", kind="video")
    if info.width * info.height > policy.max_pixels:
        raise MediaTooLargeError(
            f"video frames are {info.width}x{info.height}, above the {policy.max_pixels} "
            "pixel limit",
            kind="video",
        )
    if info.frames > policy.max_video_frames:
        raise MediaTooLargeError(
            f"the video has {info.frames} frames, above the {policy.max_video_frames} frame limit",
            kind="video",
        )
    if info.fps > 0 and info.frames / info.fps > policy.max_video_seconds:
        raise MediaTooLargeError(
            f"the video lasts {info.frames / info.fps:.1f} s, above the "
            f"{policy.max_video_seconds:g} s limit",
            kind="video",
        )
    if info.frames < 2:
        # vLLM's loader cannot read a one-frame clip (see the module's docstring).
        raise MediaDecodeError(
            f"the video has {max(info.frames, 0)} frame(s); at least 2 are needed (send a "
            "single frame as an image)",
            kind="video",
        )


def _is_frame_list(source: str) -> bool:
    header = source[5:].partition(",")[0].lower() if source[:5].lower() == "data:" else ""
    return header.split(";")[0].strip() == FRAME_LIST_MIME


def _checked_frame_list(source: str, policy: MediaPolicy) -> str:
    """vLLM's ``data:video/jpeg;base64,f1,f2,...``: each frame decoded from base64 and its
    image header checked; forwarded re-encoded from the checked bytes."""
    header, _, payload = source[5:].partition(",")
    if [p.strip().lower() for p in header.split(";")][-1] != "base64":
        raise MediaSourceError("a video/jpeg frame list must be base64-encoded", kind="video")
    if len(payload) // 4 * 3 > policy.max_bytes + 2 * (payload.count(",") + 1):
        raise byte_limit_error(policy.max_bytes, "video")
    frames, total = [], 0
    for number, encoded in enumerate(payload.split(",")):
        try:
            frame = pybase64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise MediaSourceError(
                f"frame {number} of the frame list is not valid base64", kind="video"
            ) from None
        total += len(frame)
        if total > policy.max_bytes:
            raise byte_limit_error(policy.max_bytes, "video")
        try:
            check_header(frame, policy)  # the operator's image formats and pixels
        except MediaDecodeError as error:
            raise MediaDecodeError(f"frame {number}: {error.reason}", kind="video") from None
        except MediaTooLargeError as error:
            raise MediaTooLargeError(f"frame {number}: {error.reason}", kind="video") from None
        frames.append(pybase64.b64encode(frame).decode("ascii"))
    return f"data:{FRAME_LIST_MIME};base64," + ",".join(frames)
