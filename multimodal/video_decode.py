"""Decode the frames of a clip that vLLM's OpenCV video loader would decode, as it does.

vLLM 0.32 (``vllm/multimodal/video_decoders/opencv.py``, without frame recovery) opens the
bytes in memory with OpenCV's first stream-buffered backend, reads the frame count and
rate, corrects the count by seeking to the end of the stream (then back to frame 0), lets
the loader pick indices from those facts, and grabs every frame up to the last one picked,
keeping the picked ones in RGB. A frame that fails to grab or retrieve is dropped, so the
returned indices can be fewer than those picked. Blocking: call it off the event loop.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from io import BytesIO
from typing import Any

import numpy as np

__all__ = ["DecodedClip", "TooManyPixels", "decode_picked_frames", "open_capture"]


@dataclass(frozen=True)
class DecodedClip:
    """The frames kept (N, H, W, 3 uint8 RGB), their source indices, and the clip's facts
    the picking saw (the corrected frame count and the container's rate). `frame_list`: the
    frames of a ``data:video/jpeg`` list, which vLLM takes whole without its loader (and
    without the loader's ``do_sample_frames``, even though every frame is kept)."""

    frames: np.ndarray
    indices: list[int]
    total_frames: int
    fps: float
    frame_list: bool = False


class TooManyPixels(ValueError):
    """The picked frames would take more memory than allowed."""


def decode_picked_frames(
    data: bytes,
    pick: Callable[[int, float], list[int]],
    deadline: float = math.inf,
    max_bytes: float = math.inf,
) -> DecodedClip:
    """Decode the frames ``pick(total_frames, fps)`` chooses, e.g.
    ``lambda total, fps: qwen3_vl_frames(total, fps)``. Raises ValueError if OpenCV cannot
    open the bytes (as vLLM's loader does), TooManyPixels before decoding if the picked
    frames would hold more than ``max_bytes`` of RGB, TimeoutError past ``deadline`` (a
    ``time.monotonic()`` value)."""
    with open_capture(data) as capture:
        total, fps = _corrected_facts(capture)
        picked = pick(total, fps)
        _check_size(capture, len(picked), max_bytes)
        frames, kept = _read(capture, set(picked), max(picked), deadline)
        return DecodedClip(frames, kept, total, fps)


@contextmanager
def open_capture(data: bytes) -> Iterator[Any]:
    """The clip opened from memory as vLLM opens it (a cv2.VideoCapture), released after the
    block. Raises ValueError if no backend reads memory or the bytes do not open."""
    import cv2
    import cv2.videoio_registry as registry

    backend = _backend(registry)
    if backend is None:
        raise ValueError("this server cannot read videos (no OpenCV backend)")
    stream = BytesIO(data)  # must outlive the capture, which reads it until release()
    try:
        capture = cv2.VideoCapture(stream, backend, [])
    except cv2.error:
        capture = None
    if capture is None or not capture.isOpened():
        stream.close()
        raise ValueError("the video cannot be opened (damaged or not a video)")
    try:
        yield capture
    finally:
        capture.release()
        stream.close()


def _backend(registry) -> int | None:
    """vLLM's get_cv2_video_api: the first stream-buffered backend present, a plugin only
    if its ABI/API is at least 1.2."""
    for backend in registry.getStreamBufferedBackends():
        if not registry.hasBackend(backend):
            continue
        if not registry.isBackendBuiltIn(backend):
            _, abi, api = registry.getStreamBufferedBackendPluginVersion(backend)
            if abi < 1 or (abi == 1 and api < 2):
                continue
        return backend
    return None


def _check_size(capture, count: int, max_bytes: float) -> None:
    import cv2

    width = int(capture.get(cv2.CAP_PROP_FRAME_WIDTH))
    height = int(capture.get(cv2.CAP_PROP_FRAME_HEIGHT))
    size = count * width * height * 3
    if size > max_bytes:
        raise TooManyPixels(
            f"{count} frames of {width}x{height} take {size / 2**20:.0f} MiB decoded, above "
            f"the {max_bytes / 2**20:g} MiB limit"
        )


def _corrected_facts(capture) -> tuple[int, float]:
    """vLLM's get_video_metadata: the header's count, lowered to the position an
    end-of-stream seek reports when the stream really ends there and the header counted
    more than one frame extra (an mp4 edit list hiding a lead-in)."""
    import cv2

    total = int(capture.get(cv2.CAP_PROP_FRAME_COUNT))
    fps = capture.get(cv2.CAP_PROP_FPS)
    if total > 0 and capture.set(cv2.CAP_PROP_POS_AVI_RATIO, 1.0):
        visible = int(capture.get(cv2.CAP_PROP_POS_FRAMES))
        at_end = not capture.grab()
        capture.set(cv2.CAP_PROP_POS_FRAMES, 0)
        if at_end and 0 < visible < total - 1:
            total = visible
    return total, fps


def _read(capture, picked: set[int], last: int, deadline: float) -> tuple[np.ndarray, list[int]]:
    """vLLM's _read_frames_no_recovery: grab frames 0..last in order, keep the picked ones
    that grab and retrieve, in RGB."""
    import cv2

    frames, kept = [], []
    for index in range(last + 1):
        if time.monotonic() > deadline:
            raise TimeoutError(f"decoding stopped at frame {index} of {last + 1}")
        if not capture.grab() or index not in picked:
            continue
        ok, frame = capture.retrieve()
        if ok:
            frames.append(cv2.cvtColor(frame, cv2.COLOR_BGR2RGB))
            kept.append(index)
    if not frames:
        width = int(capture.get(cv2.CAP_PROP_FRAME_WIDTH))
        height = int(capture.get(cv2.CAP_PROP_FRAME_HEIGHT))
        return np.empty((0, height, width, 3), dtype=np.uint8), kept
    return np.stack(frames), kept
