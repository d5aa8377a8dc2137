"""Which source frames of a clip vLLM's video loader keeps, per model family.

vLLM (0.32) chooses its video loader from the checkpoint's video processor class
(``VIDEO_LOADER_REGISTRY``: ``Qwen2VLVideoProcessor`` -> ``qwen2_vl``, also used by
Qwen2.5-VL; ``Qwen3VLVideoProcessor`` -> ``qwen3_vl``). Each loader computes the frame
indices from the clip's frame count (after its seek-to-the-end correction) and rate, then
decodes only those frames. To preprocess video in the gateway with the same frames, these
functions port the index selection exactly: ``compute_frames_index_to_sample`` of
``Qwen2VLVideoBackend`` and ``Qwen3VLVideoBackend`` in ``vllm/multimodal/video.py``.

Both loaders ignore the request's ``num_frames`` (vLLM passes 32 by default): only ``fps``
(default 2, capped at 30) and the ``min_frames`` / ``max_frames`` (and, for Qwen2,
``temporal_patch_size``) sampling options from ``media_io_kwargs`` count.

Pure: no decoding here. The indices are strictly increasing, so the loader's own
de-duplication of the list before decoding changes nothing.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["MAX_FPS", "MAX_FRAMES", "UNKNOWN_FPS_QWEN3", "qwen2_vl_frames", "qwen3_vl_frames"]

MAX_FRAMES = 768  # both loaders' _MAX_FRAMES: a larger max_frames option is capped to it
MAX_FPS = 30  # both loaders' _MAX_FPS: a larger requested fps is capped to it
UNKNOWN_FPS_QWEN3 = 24.0  # the rate Qwen3's loader assumes when the container reports 0


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


def _torch_float32_arange(end: int, step: float) -> np.ndarray:
    """``torch.arange(0, end, step).int()`` on CPU without torch: the length is
    ``ceil(end / step)`` in float64, each value ``i * step`` in float64 rounded to
    float32, then truncated to an integer (the rounding is what can reach ``end``)."""
    size = math.ceil(end / step)
    values = (np.arange(size, dtype=np.float64) * step).astype(np.float32)
    return values.astype(np.int64)
