"""Which source frames of a clip vLLM's video loader keeps, per model family.

vLLM (0.32) chooses its video loader from the checkpoint's video processor class
(``VIDEO_LOADER_REGISTRY``: ``Qwen2VLVideoProcessor`` -> ``qwen2_vl``, also used by
Qwen2.5-VL; ``Qwen3VLVideoProcessor`` -> ``qwen3_vl``). Each loader computes the frame
indices from the clip's frame count (after its seek-to-the-end correction) and rate, then
decodes only those frames. To preprocess video in the gateway with the same frames, these
functions port the index selection exactly: ``compute_frames_index_to_sample`` of
``Qwen2VLVideoBackend``, ``Qwen3VLVideoBackend``, ``DynamicVideoBackend`` (``opencv_dynamic``,
GLM-4.1V's ``Glm4vVideoProcessor``) and ``VideoBackend`` (``opencv``, every model whose video
processor names no loader of its own, e.g. LLaVA-OneVision) in ``vllm/multimodal/video.py``.

Both loaders ignore the request's ``num_frames`` (vLLM passes 32 by default): only ``fps``
(default 2, capped at 30) and the ``min_frames`` / ``max_frames`` (and, for Qwen2,
``temporal_patch_size``) sampling options from ``media_io_kwargs`` count.

Pure: no decoding here. The indices are strictly increasing, so the loader's own
de-duplication of the list before decoding changes nothing.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "DEFAULT_NUM_FRAMES",
    "MAX_FPS",
    "MAX_FRAMES",
    "UNKNOWN_FPS_QWEN3",
    "glm4v_frames",
    "qwen2_vl_frames",
    "qwen3_vl_frames",
    "uniform_frames",
]

MAX_FRAMES = 768  # both loaders' _MAX_FRAMES: a larger max_frames option is capped to it
MAX_FPS = 30  # both loaders' _MAX_FPS: a larger requested fps is capped to it
UNKNOWN_FPS_QWEN3 = 24.0  # the rate Qwen3's loader assumes when the container reports 0
# VideoMediaIO's num_frames when --media-io-kwargs sets none: the `opencv` loader's cap.
DEFAULT_NUM_FRAMES = 32


def qwen2_vl_frames(
    total_frames: int,
    source_fps: float,
    *,
    fps: float = 2,
    min_frames: int = 4,
    max_frames: int = MAX_FRAMES,
    temporal_patch_size: int = 2,
) -> list[int]:
    """The source frames vLLM's Qwen2-VL / Qwen2.5-VL loader keeps.

    A count of ``total / source_fps * fps`` frames, clamped to ``[min_frames, max_frames]``
    and to the clip, floored to a multiple of ``temporal_patch_size``; the indices come from
    ``torch.arange(0, total, total / n)`` in float32, truncated, the last clamped into the
    clip. That arange sometimes yields one index more than ``n`` (the float step lands a
    hair under ``total / n``): then the count is odd and the last frame is included (17
    frames at 2.4 fps give 15 indices ending on 16), as vLLM does.

    Raises ValueError where vLLM's loader fails: an unknown rate (0), or fewer than
    ``temporal_patch_size`` frames (vLLM divides by zero there).
    """
    if source_fps <= 0:
        raise ValueError("Qwen2-VL video sampling needs a known source frame rate")
    max_frames = min(max_frames, MAX_FRAMES)
    max_frames = math.floor(min(max_frames, total_frames) / temporal_patch_size)
    max_frames *= temporal_patch_size
    wanted = total_frames / source_fps * min(fps, MAX_FPS)
    wanted = min(max(wanted, min_frames), max_frames, total_frames)
    count = math.floor(wanted / temporal_patch_size) * temporal_patch_size
    if count <= 0:
        raise ValueError(
            f"the clip has {total_frames} frame(s); Qwen2-VL needs at least {temporal_patch_size}"
        )
    indices = _torch_float32_arange(total_frames, total_frames / count)
    return np.minimum(indices, total_frames - 1).tolist()


def qwen3_vl_frames(
    total_frames: int,
    source_fps: float,
    *,
    fps: float = 2,
    min_frames: int = 4,
    max_frames: int = MAX_FRAMES,
) -> list[int]:
    """The source frames vLLM's Qwen3-VL loader keeps.

    ``int(total / source_fps * fps)`` frames, at least ``min_frames``, at most
    ``max_frames`` and the clip's length, evenly spaced from the first frame to the last
    and rounded (numpy's round half to even). The count may be odd: padding to the
    temporal patch (repeating the last frame) is the video processor's job, not the
    loader's. An unknown rate (0) counts as 24 fps, as in HF's processor.
    """
    if total_frames < 1:
        raise ValueError("the clip has no frames")
    if source_fps <= 0:
        source_fps = UNKNOWN_FPS_QWEN3
    max_frames = min(max_frames, MAX_FRAMES)
    count = int(total_frames / source_fps * min(fps, MAX_FPS))
    count = min(max(count, min_frames), max_frames, total_frames)
    return np.linspace(0, total_frames - 1, count).round().astype(int).tolist()


def glm4v_frames(
    total_frames: int, source_fps: float, *, fps: float = 2, max_duration: float = 300
) -> list[int]:
    """The source frames vLLM's ``opencv_dynamic`` loader (GLM-4.1V, GLM-4.5V) keeps.

    The clip lasts ``total / source_fps`` seconds (vLLM's OpenCV metadata; 0 at an unknown
    rate). Up to ``max_duration`` seconds it takes ``floor(duration * fps)`` frames, the i-th
    at ``ceil(i * source_fps / fps)``; a longer clip gets ``max_duration * fps`` frames at
    evenly spaced seconds (every frame if the clip has no more). Deduplicated, sorted, and
    clamped into the clip; unlike Qwen's loaders the count is not rounded to the temporal
    patch (the video processor pads an odd count). ``num_frames`` is ignored.

    Raises ValueError where vLLM gets no frame at all (a clip under half a second at 2 fps,
    or an unknown rate): its processor then fails on the empty video.
    """
    duration = total_frames / source_fps if source_fps > 0 else 0
    last = total_frames - 1
    if duration <= max_duration:
        count = math.floor(duration * fps)
        picked = {min(last, math.ceil(i * source_fps / fps)) for i in range(count)}
    else:
        count = int(max_duration * fps)
        if count >= total_frames:
            return list(range(total_frames))
        seconds = np.linspace(0, duration, count, endpoint=True)
        picked = {min(last, math.ceil(t * source_fps)) for t in seconds.tolist()}
    if not picked:
        raise ValueError(
            f"the clip ({total_frames} frame(s) at {source_fps:g} fps) is too short to sample "
            f"at {fps:g} fps"
        )
    return sorted(picked)


def uniform_frames(
    total_frames: int,
    num_frames: int = DEFAULT_NUM_FRAMES,
    fps: float | None = None,
    duration: float = 0.0,
) -> list[int]:
    """The source frames vLLM's default ``opencv`` loader keeps: every frame of a clip of at
    most ``num_frames``, else ``num_frames`` evenly spaced from the first to the last,
    truncated (``np.linspace(..., dtype=int)``); with a request's ``fps``, at most
    ``floor(duration * fps)`` of them (``duration``: the clip's seconds), at least one."""
    if total_frames < 1:
        raise ValueError("the clip has no frames")
    count = min(num_frames, total_frames) if num_frames > 0 else total_frames
    if fps is not None and fps > 0:
        count = max(1, min(count, math.floor(duration * fps)))
    if count == total_frames:
        return list(range(total_frames))
    return np.linspace(0, total_frames - 1, count, dtype=int).tolist()


def _torch_float32_arange(end: int, step: float) -> np.ndarray:
    """``torch.arange(0, end, step).int()`` on CPU without torch: the length is
    ``ceil(end / step)`` in float64, each value ``i * step`` in float64 rounded to
    float32, then truncated to an integer (the rounding is what can reach ``end``)."""
    size = math.ceil(end / step)
    values = (np.arange(size, dtype=np.float64) * step).astype(np.float32)
    return values.astype(np.int64)
