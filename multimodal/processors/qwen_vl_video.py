"""Qwen2-VL and Qwen2.5-VL videos: vLLM's Qwen2 loader, then Qwen2VLVideoProcessor.

vLLM 0.32 loads a video for these models with its `qwen2_vl` loader (chosen from the
checkpoint's `Qwen2VLVideoProcessor`; Qwen2.5-VL has no video processor of its own): an even
count of frames at 2 fps in even steps (`video_frames.qwen2_vl_frames`). transformers' video
processor (torchvision backend) then resizes every frame to one smart-resized size (the
image's rule, with the video processor's own pixel bounds), bicubic on uint8, and lays the
frames out as patches of `temporal_patch_size` consecutive frames (an odd count padded with
the last frame): `<|video_pad|>` repeated t*h*w / merge^2 times per video. Qwen2.5-VL adds
`second_per_grid_ts`, temporal_patch_size / sampled fps in float32, for its M-RoPE time axis.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from multimodal.processors.base import (
    ModelConfigs,
    ProcessedItems,
    VideoProcessor,
    VideoSampling,
)
from multimodal.processors.options import first_set
from multimodal.processors.qwen_vl import smart_resize
from multimodal.processors.transforms import (
    CLIP_MEAN,
    CLIP_STD,
    channel_triple,
    fused_normalization,
    video_patches,
)
from multimodal.video_decode import DecodedClip
from multimodal.video_frames import MAX_FRAMES, qwen2_vl_frames

MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl")
LOADER_PROCESSOR = "Qwen2VLVideoProcessor"  # the video processor class vLLM's loader keys on
SIZES_KEY = "patches_per_video"
# transformers' Qwen2VLVideoProcessor defaults, for configs that leave them out.
DEFAULT_PIXELS = (128 * 28 * 28, 28 * 28 * 768)
LOADER_FPS = 2.0  # the qwen2_vl loader's fps when --media-io-kwargs sets none


@dataclass(frozen=True)
class QwenVideoSettings:
    patch_size: int
    merge_size: int
    temporal_patch_size: int
    min_pixels: int
    max_pixels: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    rescale_factor: float
    min_frames: int
    max_frames: int
    video_token_id: int
    seconds_per_grid: bool  # Qwen2.5-VL's second_per_grid_ts


@dataclass(frozen=True)
class QwenVideoSampling:
    """What one request's clips are sampled and sized with (part of every item's hash)."""

    fps: float
    min_pixels: int
    max_pixels: int


class QwenVLVideoProcessor(VideoProcessor):
    family = "qwen_vl_video"
    title = "Qwen-VL"
    placeholder_text = "<|vision_start|><|video_pad|><|vision_end|>"

    def __init__(self, settings: QwenVideoSettings) -> None:
        self.settings = settings
        self._normalize = fused_normalization(settings.mean, settings.std, settings.rescale_factor)
        self.defaults = QwenVideoSampling(LOADER_FPS, settings.min_pixels, settings.max_pixels)

    @classmethod
    def matches(cls, files: ModelConfigs) -> bool:
        kind = files.video_preprocessor.get("video_processor_type")
        return files.config.get("model_type") in MODEL_TYPES and kind in (None, LOADER_PROCESSOR)

    @classmethod
    def from_files(cls, files: ModelConfigs) -> QwenVLVideoProcessor:
        pre = files.video_preprocessor
        token = files.config.get("video_token_id")
        if token is None:
            token = files.vocab["<|video_pad|>"]
        return cls(
            QwenVideoSettings(
                patch_size=int(pre.get("patch_size", 14)),
                merge_size=int(pre.get("merge_size", 2)),
                temporal_patch_size=int(pre.get("temporal_patch_size", 2)),
                **_pixel_bounds(pre),
                mean=channel_triple(pre.get("image_mean", CLIP_MEAN)),
                std=channel_triple(pre.get("image_std", CLIP_STD)),
                rescale_factor=float(pre.get("rescale_factor", 1 / 255)),
                min_frames=int(pre.get("min_frames", 4)),
                max_frames=int(pre.get("max_frames", MAX_FRAMES)),
                video_token_id=int(token),
                seconds_per_grid=files.config.get("model_type") == "qwen2_5_vl",
            )
        )

    @property
    def anchor_token_id(self) -> int:
        return self.settings.video_token_id

    def pick_frames(
        self,
        total_frames: int,
        fps: float,
        settings: QwenVideoSampling,
        sampling: VideoSampling,
    ) -> list[int]:
        s = self.settings
        return qwen2_vl_frames(
            total_frames,
            fps,
            fps=first_set(sampling.fps, settings.fps),
            min_frames=s.min_frames,
            max_frames=s.max_frames,
            temporal_patch_size=s.temporal_patch_size,
        )

    def process(
        self, clips: Sequence[DecodedClip], settings: QwenVideoSampling, raw_pixels: bool
    ) -> ProcessedItems:
        s = self.settings
        patches, grids = [], []
        for clip in clips:
            rows, grid = self._one(clip, settings, raw_pixels)
            patches.append(rows)
            grids.append(grid)
        sizes = [math.prod(g) for g in grids]
        tensors: dict[str, np.ndarray] = {
            "pixel_values": np.concatenate(patches) if len(patches) > 1 else patches[0],
            "video_grid_thw": np.asarray(grids, dtype=np.int64).reshape(len(clips), 3),
            SIZES_KEY: np.asarray(sizes, dtype=np.int64),
        }
        on_cpu: tuple[str, ...] = ("video_grid_thw",)
        if s.seconds_per_grid:
            tensors["second_per_grid_ts"] = np.asarray(
                [s.temporal_patch_size / _sampled_fps(c) for c in clips], dtype=np.float32
            )
            on_cpu += ("second_per_grid_ts",)
        merge = s.merge_size**2
        return ProcessedItems(
            tensors=tensors,
            batched_keys=(*on_cpu, SIZES_KEY),
            flat_keys={"pixel_values": SIZES_KEY},
            keep_on_cpu_keys=on_cpu,
            replacements=[[s.video_token_id] * (size // merge) for size in sizes],
        )

    def _one(
        self, clip: DecodedClip, sampling: QwenVideoSampling, raw_pixels: bool
    ) -> tuple[np.ndarray, tuple[int, int, int]]:
        s = self.settings
        frames = clip.frames
        factor = s.patch_size * s.merge_size
        height, width = smart_resize(
            frames.shape[1], frames.shape[2], factor, sampling.min_pixels, sampling.max_pixels
        )
        normalize = None if raw_pixels else self._normalize
        rows = video_patches(
            frames, height, width, s.patch_size, s.merge_size, s.temporal_patch_size, normalize
        )
        grid_t = -(-len(frames) // s.temporal_patch_size)
        return rows, (grid_t, height // s.patch_size, width // s.patch_size)


def _pixel_bounds(pre: Mapping[str, Any]) -> dict[str, int]:
    """The video processor's pixel bounds: `size`'s edges, else min/max_pixels, else its
    class defaults (as Qwen2VLVideoProcessor.__init__ reads them)."""
    size = pre.get("size") or {}
    least, most = DEFAULT_PIXELS
    return {
        "min_pixels": int(size.get("shortest_edge") or pre.get("min_pixels") or least),
        "max_pixels": int(size.get("longest_edge") or pre.get("max_pixels") or most),
    }


def _sampled_fps(clip: DecodedClip) -> float:
    """transformers' VideoMetadata.sampled_fps on the loader's metadata: the kept frames'
    share of the clip times its rate (the rate alone for fewer than two frames)."""
    if len(clip.indices) < 2 or clip.total_frames <= 0:
        return clip.fps or 24.0
    return len(clip.indices) / clip.total_frames * clip.fps
