"""GLM-4.1V and GLM-4.5V videos: vLLM's `opencv_dynamic` loader, then Glm4vVideoProcessor.

vLLM 0.32 loads a video for a checkpoint whose video processor is `Glm4vVideoProcessor` with
its `opencv_dynamic` loader (`video_frames.glm4v_frames`: 2 fps up to 300 s, the count left
as it comes). Then `Glm4vMultiModalProcessor` runs transformers' processor on each video
alone, and what it gets depends on the loader's metadata flag `do_sample_frames`, set when
the loader kept every frame of the clip (never for a `data:video/jpeg` frame list):

- set: transformers samples again (`Glm4vVideoProcessor.sample_frames`, at the video
  processor's fps, at least one frame, an odd count made even with the last frame again);
- not set: the loader's frames as they are, an odd count padded at the patch layout.

The two differ only in the frame count smart_resize sees (its own, not the image's: bounds
on round(t / 2) * 2 frames, the shrink by t itself), which can move the size. A count under
the temporal patch fails in transformers (and so in vLLM); it is refused here.

Pixels are Qwen2-VL's patch layout (`transforms.video_patches`), uint8 when the engine
normalizes on device (GLM's default in vLLM). The prompt is vLLM's, not transformers': its
replacement target is `<|begin_of_video|><|video|><|end_of_video|>` and the replacement
(`_construct_video_placeholder`) is, per pair of frames, `<|begin_of_image|>`, `<|image|>`
h*w / merge^2 times, `<|end_of_image|>` and the pair's first second as text (int(index /
fps), tokenized alone), between the begin/end of video tokens; the embeddings go to
`<|image|>`. Here the anchor is `<|video|>`, the replacement what lies between the begin
and end tokens the template wrote, and `finish_prompt` widens each video's range over those
two, as vLLM's range covers its whole replacement. vLLM takes one video a prompt for the
model (its supported limit, above any --limit-mm-per-prompt): so does this.

GLM-4.6V (`Glm46VVideoProcessor`) has another loader, timestamps and processor: not here.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from multimodal.errors import MediaDecodeError, MmgateError
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
    CLIP_MEAN,
    CLIP_STD,
    channel_triple,
    fused_normalization,
    video_patches,
)
from multimodal.prompt import Range
from multimodal.video_decode import DecodedClip
from multimodal.video_frames import glm4v_frames

MODEL_TYPES = ("glm4v", "glm4v_moe")
LOADER_PROCESSOR = "Glm4vVideoProcessor"  # the video processor class vLLM's loader keys on
# transformers maps only glm4v to it when a checkpoint names no video processor.
DEFAULT_PROCESSOR = {"glm4v": LOADER_PROCESSOR}
PROCESSORS = ("Glm4vProcessor",)  # vLLM's timestamps as "{}" are Glm4vProcessor's
SIZES_KEY = "patches_per_video"
LOADER_FPS = 2  # opencv_dynamic's fps and max_duration when --media-io-kwargs sets none
LOADER_MAX_DURATION = 300
# Glm4vVideoProcessor's class defaults, for configs that leave them out.
DEFAULT_SIZE = {"shortest_edge": 112 * 112, "longest_edge": 28 * 28 * 2 * 30000}


@dataclass(frozen=True)
class Glm4vVideoSettings:
    """The video processor's settings (all of it is part of every item's hash)."""

    patch_size: int
    merge_size: int
    temporal_patch_size: int
    min_pixels: int
    max_pixels: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    rescale_factor: float
    fps: float  # transformers' sampling rate, when it samples (and vLLM's timestamps then)
    max_duration: float


@dataclass(frozen=True)
class _Tokens:
    video: int
    image: int
    begin_video: int
    end_video: int
    begin_image: int
    end_image: int


class Glm4vVideoProcessor(VideoProcessor):
    family = "glm4v_video"
    title = "GLM-4.1V"
    placeholder_text = "<|begin_of_video|><|video|><|end_of_video|>"

    def __init__(self, settings: Glm4vVideoSettings, tokens: _Tokens, tokenizer: Any) -> None:
        self.defaults = self.settings = settings
        self.tokens = tokens
        self._tokenizer = tokenizer
        self._normalize = fused_normalization(settings.mean, settings.std, settings.rescale_factor)

    @classmethod
    def matches(cls, files: ModelConfigs) -> bool:
        model_type = files.config.get("model_type")
        if model_type not in MODEL_TYPES:
            return False
        video = files.video_preprocessor
        kind = video.get("video_processor_type") or DEFAULT_PROCESSOR.get(model_type)
        processor = video.get("processor_class") or files.preprocessor.get("processor_class")
        return kind == LOADER_PROCESSOR and processor in (None, *PROCESSORS)

    @classmethod
    def from_files(cls, files: ModelConfigs) -> Glm4vVideoProcessor:
        pre = files.video_preprocessor
        if pre.get("resample") not in (None, 3):
            raise ModelConfigError("GLM-4.1V videos are resized bicubic only (resample 3)")
        # (do_sample_frames is not read: vLLM sets it per clip from its loader's metadata)
        for flag in ("do_resize", "do_rescale", "do_normalize"):
            if pre.get(flag) is False:
                raise ModelConfigError(f"GLM-4.1V videos with {flag} off are not supported")
        size = pre.get("size") or DEFAULT_SIZE
        merge = int(pre.get("merge_size", 2))
        # vLLM counts the tokens with the image processor's merge, the grid with the video's.
        if int(files.preprocessor.get("merge_size", 2)) != merge:
            raise ModelConfigError("GLM-4.1V's image and video merge sizes differ")
        config, vocab = files.config, files.vocab
        tokens = _Tokens(
            video=int(config.get("video_token_id") or vocab["<|video|>"]),
            image=int(config.get("image_token_id") or vocab["<|image|>"]),
            begin_video=int(config.get("video_start_token_id") or vocab["<|begin_of_video|>"]),
            end_video=int(config.get("video_end_token_id") or vocab["<|end_of_video|>"]),
            begin_image=int(config.get("image_start_token_id") or vocab["<|begin_of_image|>"]),
            end_image=int(config.get("image_end_token_id") or vocab["<|end_of_image|>"]),
        )
        settings = Glm4vVideoSettings(
            patch_size=int(pre.get("patch_size", 14)),
            merge_size=merge,
            temporal_patch_size=int(pre.get("temporal_patch_size", 2)),
            min_pixels=int(size["shortest_edge"]),
            max_pixels=int(size["longest_edge"]),
            mean=channel_triple(pre.get("image_mean", CLIP_MEAN)),
            std=channel_triple(pre.get("image_std", CLIP_STD)),
            rescale_factor=float(pre.get("rescale_factor", 1 / 255)),
            fps=float(pre.get("fps", 2)),
            max_duration=float(pre.get("max_duration", 300)),
        )
        return cls(settings, tokens, files.tokenizer)

    @property
    def anchor_token_id(self) -> int:
        return self.tokens.video

    def pick_frames(
        self,
        total_frames: int,
        fps: float,
        settings: Glm4vVideoSettings,
        sampling: VideoSampling,
    ) -> list[int]:
        rate = LOADER_FPS if sampling.fps is None else sampling.fps
        picked = glm4v_frames(total_frames, fps, fps=rate, max_duration=LOADER_MAX_DURATION)
        if len(picked) < settings.temporal_patch_size and len(picked) < total_frames:
            raise ValueError(_too_few(len(picked), settings))
        return picked

    def process(
        self, clips: Sequence[DecodedClip], settings: Glm4vVideoSettings, raw_pixels: bool
    ) -> ProcessedItems:
        s = settings
        _check_one_clip(len(clips))
        patches, grids, replacements = [], [], []
        for clip in clips:
            frames, seconds = self._frames_and_seconds(clip, s)
            rows, grid = self._patches(frames, s, raw_pixels)
            patches.append(rows)
            grids.append(grid)
            replacements.append(self._replacement(grid, seconds, s))
        sizes = [math.prod(g) for g in grids]
        return ProcessedItems(
            tensors={
                "pixel_values": np.concatenate(patches) if len(patches) > 1 else patches[0],
                "video_grid_thw": np.asarray(grids, dtype=np.int64).reshape(len(clips), 3),
                SIZES_KEY: np.asarray(sizes, dtype=np.int64),
            },
            batched_keys=("video_grid_thw", SIZES_KEY),
            flat_keys={"pixel_values": SIZES_KEY},
            keep_on_cpu_keys=("video_grid_thw",),
            replacements=replacements,
            embed_token_id=self.tokens.image,
        )

    def join(self, shares: Sequence[ItemShare]) -> ProcessedItems:
        _check_one_clip(len(shares))  # a cached clip may meet another here, not in `process`
        return super().join(shares)

    def finish_prompt(
        self, ids: list[int], ranges: list[list[Range]]
    ) -> tuple[list[int], list[list[Range]]]:
        """Each video's range widened over the begin/end of video tokens around it (only a
        video's replacement sits between them)."""
        t = self.tokens

        def widened(offset: int, length: int) -> Range:
            end = offset + length
            if (
                offset > 0
                and ids[offset - 1] == t.begin_video
                and ids[end : end + 1] == [t.end_video]
            ):
                return offset - 1, length + 2
            return offset, length

        return ids, [[widened(o, n) for o, n in group] for group in ranges]

    def _frames_and_seconds(
        self, clip: DecodedClip, s: Glm4vVideoSettings
    ) -> tuple[np.ndarray, list[int]]:
        """The frames transformers' video processor works on, and the second of each frame
        pair vLLM writes into the prompt."""
        if len(clip.indices) == 0 or clip.fps <= 0:
            raise MediaDecodeError("the video has no frames at a known rate", kind="video")
        if not clip.frame_list and len(clip.indices) == clip.total_frames:
            # vLLM's do_sample_frames: transformers samples the whole clip again.
            duration = clip.total_frames / clip.fps
            kept = _sample(clip.total_frames, clip.fps, duration, s, at_least_one=True)
            frames = clip.frames[kept]
            indices = _sample(clip.total_frames, clip.fps, duration, s, at_least_one=False)
        else:
            frames = clip.frames
            indices = _paired(list(clip.indices))
        if len(frames) < s.temporal_patch_size:
            raise MediaDecodeError(_too_few(len(frames), s), kind="video")
        return frames, [int(i / clip.fps) for i in indices][::2]

    def _patches(
        self, frames: np.ndarray, s: Glm4vVideoSettings, raw_pixels: bool
    ) -> tuple[np.ndarray, tuple[int, int, int]]:
        height, width = video_smart_resize(
            len(frames), frames.shape[1], frames.shape[2], s.temporal_patch_size,
            s.patch_size * s.merge_size, s.min_pixels, s.max_pixels,
        )  # fmt: skip
        normalize = None if raw_pixels else self._normalize
        rows = video_patches(
            frames, height, width, s.patch_size, s.merge_size, s.temporal_patch_size, normalize
        )
        grid_t = -(-len(frames) // s.temporal_patch_size)
        return rows, (grid_t, height // s.patch_size, width // s.patch_size)

    def _replacement(
        self, grid: tuple[int, int, int], seconds: list[int], s: Glm4vVideoSettings
    ) -> list[int]:
        t = self.tokens
        per_frame = grid[1] * grid[2] // s.merge_size**2
        frame = [t.begin_image, *[t.image] * per_frame, t.end_image]
        out: list[int] = []
        for second in seconds:
            out += frame
            out += self._text(second)
        return out

    @functools.lru_cache(maxsize=256)  # noqa: B019 (one processor per model, few seconds)
    def _text(self, second: int) -> tuple[int, ...]:
        return tuple(self._tokenizer.encode(str(second), add_special_tokens=False).ids)


def video_smart_resize(
    frames: int,
    height: int,
    width: int,
    temporal: int,
    factor: int,
    min_pixels: int,
    max_pixels: int,
) -> tuple[int, int]:
    """transformers' glm4v video smart_resize (Qwen3-VL's operations, `qwen_vl`'s
    `video_smart_resize`), with its refusal of fewer frames than the temporal patch."""
    if frames < temporal:
        raise OptionError(f"t:{frames} must be larger than temporal_factor:{temporal}")
    return shared_video_smart_resize(
        frames, height, width, temporal, factor, min_pixels, max_pixels
    )


def _sample(
    total: int, fps: float, duration: float, s: Glm4vVideoSettings, at_least_one: bool
) -> list[int]:
    """Glm4vVideoProcessor.sample_frames (`at_least_one`) and vLLM's copy of it for the
    timestamps (_get_video_second_idx_glm4v, without the minimum), at the processor's fps."""
    last = total - 1
    if duration <= s.max_duration:
        count = math.floor(duration * s.fps)
        if at_least_one:
            count = max(count, 1)
        indices = [min(last, math.ceil(i * fps / s.fps)) for i in range(count)]
    else:
        count = int(s.max_duration * s.fps)
        if count >= total:
            indices = list(range(total))
        else:
            seconds = np.linspace(0, duration, count, endpoint=True).tolist()
            indices = [min(last, math.ceil(t * fps)) for t in seconds]
    return _paired(indices)


def _paired(indices: list[int]) -> list[int]:
    """Deduplicated in order, an odd count made even by repeating the last."""
    unique = list(dict.fromkeys(indices))
    return unique + unique[-1:] if len(unique) % 2 else unique


def _too_few(count: int, s: Glm4vVideoSettings) -> str:
    return (
        f"GLM-4.1V samples {count} frame(s) of this video at 2 fps and needs at least "
        f"{s.temporal_patch_size}; send a clip of at least one second"
    )


def _check_one_clip(count: int) -> None:
    if count > 1:  # vLLM's supported limit for the model, whatever the server's
        raise MmgateError(
            "At most 1 video(s) may be provided in one prompt (GLM-4.1V takes one)",
            param="messages",
        )
