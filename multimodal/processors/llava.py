"""LLaVA-1.5 images: shortest-edge resize, center crop, CLIP normalize; one fixed-size grid each.

Mirrors transformers' CLIPImageProcessor / LlavaImageProcessor (torchvision backend, which vLLM
runs): optional pad-to-square with the mean colour (LlavaImageProcessor's do_pad), resize so the
shortest edge is `size.shortest_edge` (long edge truncated by int(), as transformers does) or to a
fixed height x width, center crop, then fused rescale+normalize in float32. The `<image>` anchor
becomes as many image tokens as vLLM's LlavaProcessingInfo.get_num_image_tokens counts: the
vision tower's patch grid squared, plus CLS for CLIP, minus one under the "default" feature
select strategy (576 for 336px / 14px CLIP).

The tower and token counting here are shared with LLaVA-NeXT (llava_next.py); the pixel steps
are the standard chain (pixels.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from multimodal.processors.base import (
    ItemProcessor,
    ModelConfigError,
    ModelConfigs,
    ProcessedItems,
    matches_model,
)
from multimodal.processors.options import NoOptions
from multimodal.processors.pixels import PixelPipeline, PixelSettings, pixel_settings

MODEL_TYPES = ("llava",)
# Their defaults are the ones pixel_settings falls back to (SigLIP's, say, differ).
IMAGE_PROCESSORS = ("CLIPImageProcessor", "LlavaImageProcessor")
IMAGE_TOKEN = "<image>"
# Vision towers vLLM's get_vision_encoder_info maps for LLaVA: extra (CLS) tokens and the
# transformers config defaults used when config.json leaves a field out. Pixtral towers ride on
# model_type "llava" too but use a different processor, so they are not matched here.
VISION_TOWERS = {
    "clip_vision_model": {"extra_tokens": 1, "image_size": 224, "patch_size": 32},
    "siglip_vision_model": {"extra_tokens": 0, "image_size": 224, "patch_size": 16},
}
# LlavaConfig's default tower when config.json has no vision_config at all.
DEFAULT_VISION = {"model_type": "clip_vision_model", "image_size": 336, "patch_size": 14}
DEFAULT_IMAGE_TOKEN_INDEX = 32000
SELECT_STRATEGIES = ("default", "full", "class")


@dataclass(frozen=True)
class TowerSettings:
    """The model-config half: what vLLM counts tokens from."""

    image_size: int
    patch_size: int
    extra_tokens: int
    select_strategy: str
    image_token_id: int

    @property
    def grid(self) -> int:
        return self.image_size // self.patch_size

    def base_tokens(self) -> int:
        """vLLM's get_num_selected_vision_tokens(encoder.get_num_image_tokens(), strategy)."""
        tokens = self.grid**2 + self.extra_tokens
        if self.select_strategy == "class":
            return 1
        if self.select_strategy == "default":
            return tokens - 1
        return tokens


def tower_settings(files: ModelConfigs) -> TowerSettings:
    config = files.config
    vision = dict(config.get("vision_config") or DEFAULT_VISION)
    vision_type = vision.get("model_type", "clip_vision_model")
    tower = VISION_TOWERS.get(vision_type)
    if tower is None:
        raise ModelConfigError(f"vision tower {vision_type!r} is not supported")
    strategy = config.get("vision_feature_select_strategy", "default")
    if strategy not in SELECT_STRATEGIES:
        raise ModelConfigError(f"vision_feature_select_strategy {strategy!r} is not supported")
    token = config.get("image_token_index", config.get("image_token_id"))
    if token is None:
        token = files.vocab.get(IMAGE_TOKEN, DEFAULT_IMAGE_TOKEN_INDEX)
    image_size = int(vision.get("image_size", tower["image_size"]))
    patch_size = int(vision.get("patch_size", tower["patch_size"]))
    if vision_type == "clip_vision_model" and image_size % patch_size:
        raise ModelConfigError(f"image_size {image_size} is not a multiple of {patch_size}")
    return TowerSettings(
        image_size=image_size,
        patch_size=patch_size,
        extra_tokens=tower["extra_tokens"],
        select_strategy=strategy,
        image_token_id=int(token),
    )


def family_matches(
    files: ModelConfigs, model_types: Sequence[str], processors: Sequence[str]
) -> bool:
    """model_type, a tower vLLM counts for, and an image processor whose steps we reproduce."""
    vision = files.config.get("vision_config") or DEFAULT_VISION
    return matches_model(files, model_types, processors) and (
        vision.get("model_type", "clip_vision_model") in VISION_TOWERS
    )


class LlavaProcessor(ItemProcessor):
    family = "llava"
    title = "LLaVA"
    placeholder_text = "<image>"

    def __init__(self, pixels: PixelSettings, tower: TowerSettings) -> None:
        self.pixels = PixelPipeline(pixels)
        self.tower = tower

    @classmethod
    def matches(cls, files: ModelConfigs) -> bool:
        return family_matches(files, MODEL_TYPES, IMAGE_PROCESSORS)

    @classmethod
    def from_files(cls, files: ModelConfigs) -> LlavaProcessor:
        pixels = pixel_settings(files.preprocessor)
        if pixels.crop_hw is None and (pixels.shortest_edge is not None or not pixels.do_resize):
            # Every image must come out the same size to be one batched tensor.
            raise ModelConfigError("LLaVA needs a center crop or a fixed resize size")
        return cls(pixels, tower_settings(files))

    @property
    def anchor_token_id(self) -> int:
        return self.tower.image_token_id

    def num_image_tokens(self, height: int, width: int) -> int:
        """vLLM's LlavaProcessingInfo.get_num_image_tokens: independent of the image size."""
        return self.tower.base_tokens()

    def process(
        self, images: Sequence[np.ndarray], settings: NoOptions, raw_pixels: bool
    ) -> ProcessedItems:
        crops = []
        for image in images:
            if self.pixels.settings.pad_to_square:
                image = self.pixels.square_pad(image)
            crops.append(self.pixels.resize_and_crop(image))
        if len({c.shape for c in crops}) != 1:
            raise ModelConfigError(f"crops differ in size: {sorted({c.shape for c in crops})}")
        h, w, c = crops[0].shape
        pixel_values = np.empty((len(crops), c, h, w), self.pixels.out_dtype(raw_pixels))
        for crop, out in zip(crops, pixel_values):
            self.pixels.finish(crop, raw_pixels, out)
        token = self.tower.image_token_id
        return ProcessedItems(
            tensors={"pixel_values": pixel_values},
            batched_keys=("pixel_values",),
            replacements=[[token] * self.num_image_tokens(i.shape[0], i.shape[1]) for i in images],
        )
