"""A request's say over how its videos are loaded, and how many load at once.

`media_io_kwargs` is vLLM's per-request media loader options, refused (as vLLM refuses them)
unless the operator trusts requests (`--trust-request-mm-kwargs`); of them the gateway's
video families reproduce a video's `fps` and `num_frames` (`VideoSampling`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from gateway.errors import GatewayError
from multimodal.processors.base import VideoSampling

__all__ = [
    "UNTRUSTED_MEDIA_IO",
    "VideoSampling",
    "default_video_concurrency",
    "video_sampling",
]

# vLLM 0.32's words (validate_request_mm_kwargs).
UNTRUSTED_MEDIA_IO = (
    "Per-request media_io_kwargs are disabled by default because they can change multimodal "
    "media loading resource usage. Start the server with --trust-request-mm-kwargs only when "
    "clients are trusted."
)


# vLLM's per-request video loader options the gateway's video families take.
_VIDEO_IO_OPTIONS = {"fps": float, "num_frames": int}


def video_sampling(media_io_kwargs: Mapping[str, Any] | None) -> VideoSampling:
    """A request's `media_io_kwargs` as the video sampling it asks for; anything the gateway
    does not reproduce is a 400 naming it (vLLM would pass it to its loader)."""
    if not media_io_kwargs:
        return VideoSampling()
    if unknown := sorted(set(media_io_kwargs) - {"video"}):
        raise GatewayError(
            f"media_io_kwargs.{unknown[0]}: only video loader options are supported",
            400,
            "media_io_kwargs",
        )
    video = media_io_kwargs.get("video") or {}
    if not isinstance(video, Mapping):
        raise GatewayError("media_io_kwargs.video must be an object", 400, "media_io_kwargs")
    values = {}
    for key, value in video.items():
        kind = _VIDEO_IO_OPTIONS.get(key)
        if kind is None:
            supported = ", ".join(_VIDEO_IO_OPTIONS)
            raise GatewayError(
                f"media_io_kwargs.video.{key} is not supported (supported: {supported})",
                400,
                "media_io_kwargs",
            )
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise GatewayError(
                f"media_io_kwargs.video.{key} must be a positive number",
                400,
                "media_io_kwargs",
            )
        if kind is int and value != int(value):
            raise GatewayError(
                f"media_io_kwargs.video.{key} must be an integer", 400, "media_io_kwargs"
            )
        values[key] = kind(value)
    return VideoSampling(**values)


def default_video_concurrency() -> int:
    """Half the cores, at least one: decoding a clip keeps a core busy for hundreds of ms,
    and the other half stays for the event loop, images and text (benchmarks/RESULTS.md,
    "Video": a text request's p99 under clips)."""
    return max(1, (os.cpu_count() or 2) // 2)
