"""LLaVA-OneVision images: LLaVA-NeXT's "anyres" tiles, with OneVision's token cap and defaults.

The pixels are LLaVA-NeXT's (llava_next.py, reused as is): transformers'
LlavaOnevisionImageProcessor (torchvision backend) picks the best of `image_grid_pinpoints`,
fits and zero-pads the image to it, cuts 384px tiles, puts the whole image resized to `size`
first, resizes every tile to `size` (no center crop) and normalizes; a request's images are
zero-padded to the same tile count. What differs, and lives here:

- Token count: vLLM's LlavaOnevisionProcessingInfo._get_num_unpadded_features adds the
  "anyres_max_9" cap to LLaVA-NeXT's count: when the unpadded feature map holds more than
  1.1^2 x 9 tiles' worth, it is shrunk to int(side // ratio). vLLM hardcodes the 9 (its model
  merges with "anyres_max_9" too) where transformers reads the processor's vision_aspect_ratio:
  vLLM is followed.
- Several images: vLLM hands its images to the image processor as one flat list, so every
  image is tiled and counted on its own; transformers' processor, given several images for one
  text, turns tiling off (pad to square, one tile, 729 + 1 tokens each). vLLM is the reference:
  every image here is tiled, whatever the number of images in the request.
- Defaults: LlavaOnevisionImageProcessor's (size 384x384, no crop, its 36 pinpoints) and
  LlavaOnevisionConfig's (SigLIP tower 384/14, "full" feature selection, image token 151646)
  when a config leaves them out.

Videos (`LlavaOnevisionVideoProcessor`): vLLM's default `opencv` loader keeps at most 32
frames (`video_frames.uniform_frames`); transformers' video processor resizes every frame to
its `size` (384x384, bicubic, no crop) and normalizes it (its class default is OpenAI CLIP's
mean/std, not the image processor's 0.5); vLLM hands the frames over as one (frames, 3, H, W)
item and counts ceil(grid / spatial_pool_stride)^2 tokens a frame plus one newline
(LlavaOnevisionProcessingInfo.get_num_video_tokens), whatever the frame size. Videos of
different lengths in one request kill vLLM 0.32's engine core (the model embeds such a batch
3-D); they are refused here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from multimodal import native
from multimodal.errors import MmgateError
from multimodal.processors.base import (
    ModelConfigError,
    ModelConfigs,
    ProcessedItems,
    VideoProcessor,
    VideoSampling,
)
from multimodal.processors.items import ItemShare
from multimodal.processors.llava import TowerSettings, family_matches, tower_settings
from multimodal.processors.llava_next import AnyresSettings, LlavaNextProcessor, unpadded_features
from multimodal.processors.llava_next import _pinpoints as _checked_pinpoints
from multimodal.processors.options import first_set
from multimodal.processors.pixels import PixelPipeline, pixel_settings
from multimodal.processors.transforms import select_best_resolution
from multimodal.video_decode import DecodedClip
from multimodal.video_frames import DEFAULT_NUM_FRAMES, uniform_frames

MODEL_TYPES = ("llava_onevision",)
IMAGE_PROCESSORS = ("LlavaOnevisionImageProcessor",)
# LlavaOnevisionImageProcessor's and LlavaOnevisionConfig's default pinpoints: 384 x 1..6 each way.
DEFAULT_PINPOINTS = tuple((384 * h, 384 * w) for h in range(1, 7) for w in range(1, 7))
DEFAULT_SIZE = {"height": 384, "width": 384}
# LlavaOnevisionConfig's tower when config.json has none (its __post_init__).
DEFAULT_VISION = {"model_type": "siglip_vision_model", "image_size": 384, "patch_size": 14}
DEFAULT_IMAGE_TOKEN_INDEX = 151646
# The "anyres_max_9" of vLLM's count and merge: at most about 9 tiles' worth of features.
MAX_TILES = 9
VIDEO_PROCESSOR = "LlavaOnevisionVideoProcessor"
DEFAULT_VIDEO_TOKEN_INDEX = 151647  # LlavaOnevisionConfig's


def capped_features(
    height: int, width: int, npatches: int, num_patch_height: int, num_patch_width: int
) -> tuple[int, int]:
    """vLLM's LlavaOnevisionProcessingInfo._get_num_unpadded_features: LLaVA-NeXT's unpadded
    features and newlines, then the anyres_max_9 shrink."""
    unpadded, rows = unpadded_features(height, width, npatches, num_patch_height, num_patch_width)
    cols = unpadded // rows
    ratio = math.sqrt(rows * cols / (MAX_TILES * npatches**2))
    if ratio > 1.1:
        # int() of a float floor division, as vLLM (and the model's interpolate size) has it
        rows, cols = int(rows // ratio), int(cols // ratio)
        return rows * cols, rows
    return unpadded, rows


def num_image_tokens(
    height: int, width: int, tower: TowerSettings, pinpoints: Sequence[Sequence[int]]
) -> int:
    """vLLM's LlavaOnevisionProcessingInfo.get_num_image_tokens for an image of this size."""
    best_h, best_w = select_best_resolution(height, width, pinpoints)
    features, newlines = capped_features(
        height, width, tower.grid, best_h // tower.image_size, best_w // tower.image_size
    )
    return features + newlines + tower.base_tokens()


class LlavaOnevisionProcessor(LlavaNextProcessor):
    """LLaVA-NeXT's tiles and tensors (pixel_values per image with its tiles, image_sizes kept
    on CPU, both batched), counted the OneVision way."""

    family = "llava_onevision"
    title = "LLaVA-OneVision"
    placeholder_text = "<image>"  # LlavaOnevisionForConditionalGeneration.get_placeholder_str

    @classmethod
    def matches(cls, files: ModelConfigs) -> bool:
        return family_matches(_with_defaults(files), MODEL_TYPES, IMAGE_PROCESSORS)

    @classmethod
    def from_files(cls, files: ModelConfigs) -> LlavaOnevisionProcessor:
        files = _with_defaults(files)
        pre = files.preprocessor
        size = dict(pre.get("size") or DEFAULT_SIZE)
        # do_pad pads the tile count for batching (not to a square); the class's
        # do_center_crop is None, i.e. no crop, where pixel_settings would default to one.
        crop_on = bool(pre.get("do_center_crop"))
        settings = pixel_settings({**pre, "size": size, "do_pad": False, "do_center_crop": crop_on})
        if size.get("height") and size.get("width"):
            base_hw = (int(size["height"]), int(size["width"]))
        else:
            base_hw = (int(size["shortest_edge"]),) * 2
        crop = pre.get("crop_size") or {}
        tile = int(crop.get("height") or base_hw[0])  # the image processor's patch_size
        anyres = AnyresSettings(
            pinpoints=_pinpoints(pre.get("image_grid_pinpoints")), base_hw=base_hw, tile=tile
        )
        model_pinpoints = _pinpoints(files.config.get("image_grid_pinpoints"))
        return cls(PixelPipeline(settings), anyres, tower_settings(files), model_pinpoints)

    def num_image_tokens(self, height: int, width: int) -> int:
        return num_image_tokens(height, width, self.tower, self.model_pinpoints)


class LlavaOnevisionVideoProcessor(VideoProcessor):
    """A video is its frames, each resized and normalized as one item: (frames, 3, H, W)
    under `pixel_values` (the engine's pixel_values_videos), batched."""

    family = "llava_onevision_video"
    title = "LLaVA-OneVision"
    placeholder_text = "<video>"  # LlavaOnevisionForConditionalGeneration.get_placeholder_str

    def __init__(self, pixels: PixelPipeline, frame_tokens: int, video_token_id: int) -> None:
        self.pixels = pixels
        self.frame_tokens = frame_tokens
        self.video_token_id = video_token_id

    @classmethod
    def matches(cls, files: ModelConfigs) -> bool:
        if not LlavaOnevisionProcessor.matches(files):
            return False
        return files.video_preprocessor.get("video_processor_type") in (None, VIDEO_PROCESSOR)

    @classmethod
    def from_files(cls, files: ModelConfigs) -> LlavaOnevisionVideoProcessor:
        pre = files.video_preprocessor
        size = dict(pre.get("size") or DEFAULT_SIZE)
        if not (size.get("height") and size.get("width")):
            raise ModelConfigError("LLaVA-OneVision videos resize to a height and width only")
        if pre.get("do_sample_frames"):
            raise ModelConfigError("LLaVA-OneVision videos with do_sample_frames on")
        # The class's do_center_crop is None (no crop), where pixel_settings defaults to one.
        crop_on = bool(pre.get("do_center_crop"))
        settings = pixel_settings({**pre, "size": size, "do_pad": False, "do_center_crop": crop_on})
        config = _with_defaults(files).config
        grid = tower_settings(_with_defaults(files)).grid
        pooled = math.ceil(grid / int(config.get("spatial_pool_stride", 2)))
        token = config.get("video_token_index", config.get("video_token_id"))
        if token is None:
            token = files.vocab.get("<video>", DEFAULT_VIDEO_TOKEN_INDEX)
        return cls(PixelPipeline(settings), pooled * pooled, int(token))

    @property
    def anchor_token_id(self) -> int:
        return self.video_token_id

    def pick_frames(
        self, total_frames: int, fps: float, settings: Any, sampling: VideoSampling
    ) -> list[int]:
        num_frames = first_set(sampling.num_frames, DEFAULT_NUM_FRAMES)
        duration = total_frames / fps if fps > 0 else 0.0  # vLLM's OpenCV metadata
        return uniform_frames(total_frames, num_frames, sampling.fps, duration)

    def process(
        self, clips: Sequence[DecodedClip], settings: Any, raw_pixels: bool
    ) -> ProcessedItems:
        self._check_frame_counts([len(clip.indices) for clip in clips])
        first = self.pixels.resize_and_crop(clips[0].frames[0])
        shape = (len(clips), len(clips[0].indices), 3, *first.shape[:2])
        # From the native pool: a float32 batch of 32 frames is ~57 MB, which would otherwise
        # take fresh, zeroed pages from the kernel on every request.
        out = native.OUTPUTS.empty(shape, self.pixels.out_dtype(raw_pixels))
        for clip, into in zip(clips, out):
            self._frames(clip.frames, raw_pixels, into)
        tokens = self.frame_tokens * shape[1] + 1
        return ProcessedItems(
            tensors={"pixel_values": out},
            batched_keys=("pixel_values",),
            replacements=[[self.video_token_id] * tokens for _ in clips],
        )

    def join(self, shares: Sequence[ItemShare]) -> ProcessedItems:
        # Cached clips meet new ones here, not in `process`: the same refusal.
        self._check_frame_counts([len(s.tensors["pixel_values"]) for s in shares])
        return super().join(shares)

    def _check_frame_counts(self, counts: list[int]) -> None:
        if len(set(counts)) > 1:
            # vLLM 0.32 hands videos of different lengths to the model as a list, whose
            # embeddings it returns 3-D: its engine core dies on them. Refused instead.
            raise MmgateError(
                "the videos of one request must have the same number of frames after "
                f"sampling for {self.title} (at most {DEFAULT_NUM_FRAMES}; these have "
                f"{counts})",
                param="messages",
            )

    def _frames(self, frames: np.ndarray, raw_pixels: bool, out: np.ndarray) -> None:
        """(N, H, W, 3) uint8 into `out` (N, 3, h, w): uint8 when raw, else normalized
        float32."""
        for k, frame in enumerate(frames):
            self.pixels.finish(self.pixels.resize_and_crop(frame), raw_pixels, out[k])


@dataclasses.dataclass(frozen=True)
class _Defaulted:
    """A model's files with LlavaOnevisionConfig's defaults filled into config.json, so the
    shared LLaVA tower reader (whose defaults are LlavaConfig's) sees OneVision's."""

    config: Mapping[str, Any]
    preprocessor: Mapping[str, Any]
    vocab: Mapping[str, int]
    tokenizer: Any


def _with_defaults(files: ModelConfigs) -> ModelConfigs:
    config = dict(files.config)
    vision = dict(config.get("vision_config") or DEFAULT_VISION)
    vision.setdefault("model_type", "siglip_vision_model")
    config["vision_config"] = vision
    config.setdefault("vision_feature_select_strategy", "full")
    if "image_token_index" not in config and "image_token_id" not in config:
        config["image_token_index"] = DEFAULT_IMAGE_TOKEN_INDEX
    return _Defaulted(config, files.preprocessor, files.vocab, getattr(files, "tokenizer", None))


def _pinpoints(value: Any) -> tuple[tuple[int, int], ...]:
    """OneVision's default pinpoints when unset, else LLaVA-NeXT's checks."""
    return DEFAULT_PINPOINTS if value is None else _checked_pinpoints(value)
