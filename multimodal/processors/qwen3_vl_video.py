"""Qwen3-VL and Qwen3.5 videos: vLLM 0.32's Qwen3 loader frames, transformers'
Qwen3VLVideoProcessor tensors, and the timestamped replacement vLLM's processor writes.

- Frames: vLLM's `qwen3_vl` loader keeps evenly spaced rounded indices from the first frame to
  the last (`video_frames.qwen3_vl_frames`). When that keeps every frame of the clip, vLLM's
  metadata says `do_sample_frames` and transformers samples again, with the video processor's
  own fps / min_frames / max_frames (equal to the loader's for released checkpoints).
- Pixels: the whole clip resized once, to the size transformers' video `smart_resize` gives
  (the temporal patch count in the pixel budget), frame by frame bicubic; an odd frame count
  padded by repeating the last frame; Qwen's patch layout.
- Prompt: per temporal patch `<{t:.1f} seconds>` (t the mean of its first and last source
  frame's time, idx / fps, an unknown rate taken as 24 fps) then `<|vision_start|>`, the
  frame's `<|video_pad|>` tokens and `<|vision_end|>`. transformers >= 5.10 (5.19 here)
  replaces only the bare `<|video_pad|>` the chat template writes, keeping the template's own
  vision start/end around the whole: the anchor is that token.
- Tensors per item as vLLM keeps them: the patches (flat by `video_grid_thw`), the grid, and
  `timestamps` (batched, on the CPU), which vLLM's model reads only when it prunes video
  tokens (EVS), where it rebuilds the replacement from them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from multimodal.errors import MediaDecodeError
from multimodal.processors.base import (
    ModelConfigError,
    ModelConfigs,
    ProcessedItems,
    VideoProcessor,
    VideoSampling,
)
from multimodal.processors.items import ItemShare
from multimodal.processors.options import OptionError
from multimodal.processors.qwen_vl import video_smart_resize as shared_video_smart_resize
from multimodal.processors.transforms import (
    RESAMPLE,
    channel_triple,
    fused_normalization,
    video_patches,
)
from multimodal.video_decode import DecodedClip
from multimodal.video_frames import UNKNOWN_FPS_QWEN3, qwen3_vl_frames

MODEL_TYPES = ("qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe")
LOADER_PROCESSOR = "Qwen3VLVideoProcessor"  # the video processor class vLLM's loader keys on
SIZES_KEY = "patches_per_video"
# Qwen3VLVideoProcessor's class defaults, for keys its config leaves out.
DEFAULT_SIZE = {"shortest_edge": 128 * 32 * 32, "longest_edge": 32 * 32 * 768}
DEFAULT_MEAN_STD = (0.5, 0.5, 0.5)  # IMAGENET_STANDARD_MEAN / _STD


@dataclass(frozen=True)
class Qwen3VideoModel:
    """What the model fixes: the encoder's patches, normalization and token ids."""

    patch_size: int
    merge_size: int
    temporal_patch_size: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    rescale_factor: float
    video_token_id: int
    vision_start_id: int
    vision_end_id: int


@dataclass(frozen=True)
class Qwen3VideoSettings:
    """What a request's videos are processed with (part of every item's hash)."""

    min_pixels: int  # size.shortest_edge: of the whole clip (frames x height x width)
    max_pixels: int  # size.longest_edge
    fps: float  # the video processor's sampling, used when the loader kept every frame
    min_frames: int
    max_frames: int
    cap_pixels_per_frame: bool  # qwen-vl-utils' per-frame cap (off unless the config says so)
    max_video_tokens: int


def video_smart_resize(
    num_frames: int,
    height: int,
    width: int,
    temporal_factor: int,
    factor: int,
    min_pixels: int,
    max_pixels: int,
) -> tuple[int, int]:
    """transformers' qwen3_vl video `smart_resize`, to the operation: sides below `factor`
    scaled up first (int()), the budget compared with the rounded frame count (Python's
    banker's round) but beta computed with the real one."""
    if num_frames < temporal_factor:
        raise MediaDecodeError(
            f"the video gave {num_frames} decodable frame(s); Qwen3-VL needs at least "
            f"{temporal_factor}",
            kind="video",
        )
    return shared_video_smart_resize(
        num_frames, height, width, temporal_factor, factor, min_pixels, max_pixels
    )


def timestamps(indices: Sequence[int], fps: float, temporal: int) -> list[float]:
    """vLLM's `_calculate_timestamps`: the indices padded with the last to a multiple of
    `temporal`, each idx / fps, then per group the mean of its first and last (in Python
    floats, as vLLM)."""
    indices = list(indices)
    if pad := -len(indices) % temporal:
        indices += [indices[-1]] * pad
    seconds = [i / fps for i in indices]
    return [(seconds[i] + seconds[i + temporal - 1]) / 2 for i in range(0, len(seconds), temporal)]


class Qwen3VLVideoProcessor(VideoProcessor):
    family = "qwen3_vl_video"
    title = "Qwen3-VL"
    placeholder_text = "<|vision_start|><|video_pad|><|vision_end|>"

    def __init__(
        self, model: Qwen3VideoModel, settings: Qwen3VideoSettings, tokenizer: Any
    ) -> None:
        self.model = model
        self.defaults = settings
        self._tokenizer = tokenizer
        self._normalize = fused_normalization(model.mean, model.std, model.rescale_factor)
        self._stamp_ids: dict[str, list[int]] = {}

    @classmethod
    def matches(cls, files: ModelConfigs) -> bool:
        # vLLM picks its loader by the video processor class: the Qwen3 one, named or implied.
        kind = _video_config(files).get("video_processor_type")
        return files.config.get("model_type") in MODEL_TYPES and kind in (None, LOADER_PROCESSOR)

    @classmethod
    def from_files(cls, files: ModelConfigs) -> Qwen3VLVideoProcessor:
        pre = _video_config(files)
        for flag in ("do_resize", "do_rescale", "do_normalize"):
            if not pre.get(flag, True):
                raise ModelConfigError(f"Qwen3-VL video with {flag}=false is not supported")
        if RESAMPLE.get(pre.get("resample", 3)) != "bicubic":
            raise ModelConfigError(f"Qwen3-VL video resample {pre.get('resample')} unsupported")
        size = {**DEFAULT_SIZE, **(pre.get("size") or {})}
        if not size.get("shortest_edge") or not size.get("longest_edge"):
            raise ModelConfigError(f"Qwen3-VL video size needs both edges, got {size}")
        model = Qwen3VideoModel(
            patch_size=int(pre.get("patch_size", 16)),
            merge_size=int(pre.get("merge_size", 2)),
            temporal_patch_size=int(pre.get("temporal_patch_size", 2)),
            mean=channel_triple(pre.get("image_mean", DEFAULT_MEAN_STD)),
            std=channel_triple(pre.get("image_std", DEFAULT_MEAN_STD)),
            rescale_factor=float(pre.get("rescale_factor", 1 / 255)),
            video_token_id=int(_token(files, "video_token_id", "<|video_pad|>")),
            vision_start_id=int(_token(files, "vision_start_token_id", "<|vision_start|>")),
            vision_end_id=int(_token(files, "vision_end_token_id", "<|vision_end|>")),
        )
        settings = Qwen3VideoSettings(
            min_pixels=int(size["shortest_edge"]),
            max_pixels=int(size["longest_edge"]),
            fps=float(pre.get("fps") or 2),
            min_frames=int(pre.get("min_frames", 4)),
            max_frames=int(pre.get("max_frames", 768)),
            cap_pixels_per_frame=bool(pre.get("cap_pixels_per_frame")),
            max_video_tokens=int(pre.get("max_video_tokens", 768)),
        )
        return cls(model, settings, files.tokenizer)

    @property
    def anchor_token_id(self) -> int:
        return self.model.video_token_id

    def settings_for(self, options: Any) -> Qwen3VideoSettings:
        return self.defaults  # no mm_processor_kwargs yet: the model's settings

    def pick_frames(
        self,
        total_frames: int,
        fps: float,
        settings: Qwen3VideoSettings,
        sampling: VideoSampling,
    ) -> list[int]:
        # The loader's own sampling (fps 2, 4 to 768 frames: vLLM's load_bytes defaults and
        # media_io_kwargs, not the processor config).
        try:
            if sampling.fps is not None:
                return qwen3_vl_frames(total_frames, fps, fps=sampling.fps)
            return qwen3_vl_frames(total_frames, fps)
        except ValueError as error:
            raise OptionError(str(error)) from None

    def process(
        self, clips: Sequence[DecodedClip], settings: Qwen3VideoSettings, raw_pixels: bool
    ) -> ProcessedItems:
        m = self.model
        patches, grids, stamps, replacements = [], [], [], []
        for clip in clips:
            frames, indices, fps = self._sampled(clip, settings)
            height, width = self._target_size(frames, settings)
            normalize = None if raw_pixels else self._normalize
            patches.append(
                video_patches(
                    frames,
                    height,
                    width,
                    m.patch_size,
                    m.merge_size,
                    m.temporal_patch_size,
                    normalize,
                )  # fmt: skip
            )
            grid = (
                -(-len(frames) // m.temporal_patch_size),
                height // m.patch_size,
                width // m.patch_size,
            )
            grids.append(grid)
            seconds = timestamps(indices, fps, m.temporal_patch_size)
            stamps.append(seconds)
            replacements.append(self._replacement(grid, seconds))
        sizes = [math.prod(g) for g in grids]
        tensors = {
            "pixel_values": np.concatenate(patches) if len(patches) > 1 else patches[0],
            "video_grid_thw": np.asarray(grids, dtype=np.int64).reshape(len(clips), 3),
            SIZES_KEY: np.asarray(sizes, dtype=np.int64),
        }
        flat_keys = {"pixel_values": SIZES_KEY}
        # float32: the wire carries no float64 (vLLM keeps Python floats; the engine casts
        # every float tensor to the model's dtype either way). Batched as vLLM's field when the
        # clips have one frame count; otherwise each item's row is cut from a flat tensor.
        if len({len(s) for s in stamps}) == 1:
            tensors["timestamps"] = np.asarray(stamps, dtype=np.float32)
            batched = ("video_grid_thw", SIZES_KEY, "timestamps")
        else:
            tensors["timestamps"] = np.asarray([t for s in stamps for t in s], dtype=np.float32)
            tensors["frames_per_video"] = np.asarray([len(s) for s in stamps], dtype=np.int64)
            flat_keys["timestamps"] = "frames_per_video"
            batched = ("video_grid_thw", SIZES_KEY, "frames_per_video")
        return ProcessedItems(
            tensors=tensors,
            batched_keys=batched,
            flat_keys=flat_keys,
            keep_on_cpu_keys=("video_grid_thw", "timestamps"),
            replacements=replacements,
            embed_token_id=m.video_token_id,
        )

    def join(self, shares: Sequence[ItemShare]) -> ProcessedItems:
        # Timestamps are batched when the clips have one frame count, flat otherwise (as
        # `process` lays them out): each share is brought to a lone clip's layout first.
        alone = [_as_lone_clip(s) for s in shares]
        joined = super().join(alone)
        stamps = [s.tensors["timestamps"] for s in alone]
        if len({len(t) for t in stamps}) > 1:
            joined.tensors["timestamps"] = np.concatenate(stamps)
            joined.tensors["frames_per_video"] = np.asarray([len(t) for t in stamps], np.int64)
            joined.flat_keys = {"pixel_values": SIZES_KEY, "timestamps": "frames_per_video"}
            joined.batched_keys = ("video_grid_thw", SIZES_KEY, "frames_per_video")
        else:
            joined.flat_keys = {"pixel_values": SIZES_KEY}
            joined.batched_keys = ("video_grid_thw", SIZES_KEY, "timestamps")
        return joined

    def _sampled(
        self, clip: DecodedClip, settings: Qwen3VideoSettings
    ) -> tuple[np.ndarray, list[int], float]:
        """The frames transformers processes, their source indices, and the rate their times
        come from. vLLM marks a clip whose every frame the loader kept `do_sample_frames`;
        transformers then samples those frames with its own settings (so does vLLM for the
        timestamps)."""
        fps = clip.fps if clip.fps > 0 else UNKNOWN_FPS_QWEN3
        total = clip.total_frames
        if len(clip.indices) != total:
            return clip.frames, list(clip.indices), fps
        count = int(total / fps * settings.fps)
        count = min(max(count, settings.min_frames), settings.max_frames, total)
        picked = np.linspace(0, total - 1, count).round().astype(int)
        return clip.frames[picked], picked.tolist(), fps

    def _target_size(self, frames: np.ndarray, s: Qwen3VideoSettings) -> tuple[int, int]:
        m = self.model
        factor = m.patch_size * m.merge_size
        count, (height, width) = len(frames), frames.shape[1:3]
        max_pixels = s.max_pixels
        if s.cap_pixels_per_frame:
            frame_cap = s.max_video_tokens * factor * factor
            per_frame = max(min(frame_cap, s.max_pixels // count), int(s.min_pixels * 1.05))
            max_pixels = per_frame * count
        return video_smart_resize(
            count, height, width, m.temporal_patch_size, factor, s.min_pixels, max_pixels
        )

    def _replacement(self, grid: tuple[int, int, int], seconds: list[float]) -> list[int]:
        """vLLM's `get_video_repl`: each timestamp's text tokenized on its own."""
        m = self.model
        per_frame = grid[1] * grid[2] // m.merge_size**2
        frame = [m.vision_start_id, *[m.video_token_id] * per_frame, m.vision_end_id]
        ids: list[int] = []
        for t in seconds:
            ids += self._stamp(f"<{t:.1f} seconds>")
            ids += frame
        return ids

    def _stamp(self, text: str) -> list[int]:
        ids = self._stamp_ids.get(text)
        if ids is None:
            ids = self._stamp_ids[text] = self._tokenizer.encode(text, add_special_tokens=False).ids
        return ids


def _video_config(files: ModelConfigs) -> Mapping[str, Any]:
    # transformers reads the video processor from video_preprocessor_config.json (or
    # processor_config.json's "video_processor") and else from preprocessor_config.json.
    return files.video_preprocessor or files.preprocessor


def _token(files: ModelConfigs, key: str, text: str) -> int:
    value = files.config.get(key)
    return files.vocab[text] if value is None else value


def _as_lone_clip(share: ItemShare) -> ItemShare:
    """A share as `process` lays out a batch of one clip: batched timestamps, no frame count."""
    if "frames_per_video" not in share.kinds:
        return share
    tensors = {k: v for k, v in share.tensors.items() if k != "frames_per_video"}
    kinds = {k: v for k, v in share.kinds.items() if k != "frames_per_video"}
    kinds["timestamps"] = "batched"
    return dataclasses.replace(share, tensors=tensors, kinds=kinds)
