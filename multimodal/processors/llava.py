"""LLaVA-1.5 images: shortest-edge resize, center crop, CLIP normalize; one fixed-size grid each.

Mirrors transformers' CLIPImageProcessor / LlavaImageProcessor (torchvision backend, which vLLM
runs): optional pad-to-square with the mean colour (LlavaImageProcessor's do_pad), resize so the
shortest edge is `size.shortest_edge` (long edge truncated by int(), as transformers does) or to a
fixed height x width, center crop, then fused rescale+normalize in float32. The `<image>` anchor
becomes as many image tokens as vLLM's LlavaProcessingInfo.get_num_image_tokens counts: the
vision tower's patch grid squared, plus CLS for CLIP, minus one under the "default" feature
select strategy (576 for 336px / 14px CLIP).

The geometry helpers here are shared with LLaVA-NeXT (llava_next.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from multimodal import native
from multimodal.processors.base import (
    ImageProcessor,
    ModelFiles,
    OptionError,
    ProcessedImages,
)
from multimodal.resize import resize

MODEL_TYPES = ("llava",)
# Their defaults are the ones pixel_settings falls back to (SigLIP's, say, differ).
IMAGE_PROCESSORS = ("CLIPImageProcessor", "LlavaImageProcessor")
IMAGE_TOKEN = "<image>"
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
# PIL resample codes transformers stores in preprocessor configs.
RESAMPLE = {2: "bilinear", 3: "bicubic"}
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


class ModelConfigError(ValueError):
    """The model dir's configs describe something this family cannot reproduce."""


@dataclass(frozen=True)
class PixelSettings:
    """The image-processor half of a LLaVA-like model: how pixels become a crop."""

    shortest_edge: int | None  # resize keeping aspect so the short side is this...
    resize_hw: tuple[int, int] | None  # ...or to exactly (height, width)
    do_resize: bool
    crop_hw: tuple[int, int] | None  # None: no center crop
    pad_to_square: bool
    method: str
    do_rescale: bool
    rescale_factor: float
    do_normalize: bool
    mean: tuple[float, float, float]
    std: tuple[float, float, float]


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


def pixel_settings(pre: Mapping[str, Any]) -> PixelSettings:
    size = dict(pre.get("size") or {"shortest_edge": 224})
    crop = dict(pre.get("crop_size") or {"height": 224, "width": 224})
    if isinstance(pre.get("size"), int):  # very old configs: a bare int means shortest edge
        size = {"shortest_edge": pre["size"]}
    if isinstance(pre.get("crop_size"), int):
        crop = {"height": pre["crop_size"], "width": pre["crop_size"]}
    if size.get("shortest_edge") and size.get("longest_edge"):
        raise ModelConfigError("size with both shortest_edge and longest_edge is not supported")
    resample = int(pre.get("resample", 3))
    if resample not in RESAMPLE:
        raise ModelConfigError(f"resample mode {resample} is not supported (bilinear or bicubic)")
    do_crop = bool(pre.get("do_center_crop", True))
    return PixelSettings(
        shortest_edge=int(size["shortest_edge"]) if size.get("shortest_edge") else None,
        resize_hw=None if size.get("shortest_edge") else (int(size["height"]), int(size["width"])),
        do_resize=bool(pre.get("do_resize", True)),
        crop_hw=(int(crop["height"]), int(crop["width"])) if do_crop else None,
        pad_to_square=bool(pre.get("do_pad", False)),
        method=RESAMPLE[resample],
        do_rescale=bool(pre.get("do_rescale", True)),
        rescale_factor=float(pre.get("rescale_factor", 1 / 255)),
        do_normalize=bool(pre.get("do_normalize", True)),
        mean=_triple(pre.get("image_mean", CLIP_MEAN)),
        std=_triple(pre.get("image_std", CLIP_STD)),
    )


def tower_settings(files: ModelFiles) -> TowerSettings:
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
    files: ModelFiles, model_types: Sequence[str], processors: Sequence[str]
) -> bool:
    """model_type, a tower vLLM counts for, and an image processor whose steps we reproduce."""
    vision = files.config.get("vision_config") or DEFAULT_VISION
    kind = files.preprocessor.get("image_processor_type")
    return (
        files.config.get("model_type") in model_types
        and vision.get("model_type", "clip_vision_model") in VISION_TOWERS
        and (kind is None or kind.removesuffix("Fast") in processors)
    )


def no_options(options: Mapping[str, Any], family: str) -> dict[str, Any]:
    # vLLM counts LLaVA tokens from the model config alone, so a per-request size or crop would
    # make the pixels disagree with the placeholder count; nothing is accepted.
    if options:
        raise OptionError(
            f"unsupported mm_processor_kwargs {sorted(options)} for {family} (accepted: none)"
        )
    return {}


def shortest_edge_size(height: int, width: int, size: int) -> tuple[int, int]:
    """transformers' get_resize_output_image_size(default_to_square=False): long edge int()."""
    short, long = (width, height) if width <= height else (height, width)
    new_long = int(size * long / short)
    return (new_long, size) if width <= height else (size, new_long)


def resize_to(image: np.ndarray, height: int, width: int, method: str) -> np.ndarray:
    # torchvision returns the input untouched when the size does not change.
    if image.shape[:2] == (height, width):
        return image
    return resize(image, height, width, method)


def pad(image: np.ndarray, left: int, top: int, right: int, bottom: int, fill=0) -> np.ndarray:
    """tvF.pad with a constant (scalar or per-channel) fill, HWC."""
    h, w, c = image.shape
    out = np.empty((h + top + bottom, w + left + right, c), dtype=image.dtype)
    fill = np.asarray(fill, dtype=image.dtype)
    # Fill only the border strips; the image is copied over the rest.
    out[:top] = fill
    out[top + h :] = fill
    out[top : top + h, :left] = fill
    out[top : top + h, left + w :] = fill
    out[top : top + h, left : left + w] = image
    return out


def center_crop(image: np.ndarray, crop_h: int, crop_w: int) -> np.ndarray:
    """TorchvisionBackend.center_crop: zero-pad when too small, then int((size - crop) / 2)."""
    h, w = image.shape[:2]
    if crop_w > w or crop_h > h:
        image = pad(
            image,
            (crop_w - w) // 2 if crop_w > w else 0,
            (crop_h - h) // 2 if crop_h > h else 0,
            (crop_w - w + 1) // 2 if crop_w > w else 0,
            (crop_h - h + 1) // 2 if crop_h > h else 0,
        )
        h, w = image.shape[:2]
        if (h, w) == (crop_h, crop_w):
            return image
    top = int((h - crop_h) / 2.0)
    left = int((w - crop_w) / 2.0)
    return image[top : top + crop_h, left : left + crop_w]


class PixelPipeline:
    """Resize/crop/normalize steps of the torchvision backend, on HWC uint8 arrays."""

    def __init__(self, settings: PixelSettings) -> None:
        self.settings = s = settings
        if s.do_rescale and s.do_normalize:
            # Fused as transformers does it: (x - mean/r) / (std/r) in float32.
            scale = np.float32(1.0 / s.rescale_factor)
            self._mean = np.asarray(s.mean, dtype=np.float32) * scale
            self._std = np.asarray(s.std, dtype=np.float32) * scale
        else:
            self._mean = np.asarray(s.mean, dtype=np.float32)
            self._std = np.asarray(s.std, dtype=np.float32)

    def resize_and_crop(self, image: np.ndarray) -> np.ndarray:
        s = self.settings
        if not s.do_resize:
            return image if s.crop_hw is None else center_crop(image, *s.crop_hw)
        if s.shortest_edge is not None:
            height, width = shortest_edge_size(image.shape[0], image.shape[1], s.shortest_edge)
        else:
            height, width = s.resize_hw
        if s.crop_hw is None:
            return resize_to(image, height, width, s.method)
        crop_h, crop_w = s.crop_hw
        if crop_h > height or crop_w > width:  # the crop pads the resized image
            return center_crop(resize_to(image, height, width, s.method), crop_h, crop_w)
        # center_crop's window, and only it resized (the same pixels, less work)
        top, left = int((height - crop_h) / 2.0), int((width - crop_w) / 2.0)
        return resize(image, height, width, s.method, crop=(top, left, crop_h, crop_w))

    def keeps(self, height: int, width: int) -> bool:
        """Whether `resize_and_crop` hands an image of this size back untouched."""
        s = self.settings
        if s.crop_hw not in (None, (height, width)):
            return False
        if not s.do_resize:
            return True
        if s.shortest_edge is not None:
            return shortest_edge_size(height, width, s.shortest_edge) == (height, width)
        return s.resize_hw == (height, width)

    def out_dtype(self, raw_pixels: bool) -> type:
        """What `finish` returns: float32 unless raw or neither rescaled nor normalized."""
        s = self.settings
        return np.uint8 if raw_pixels or not (s.do_normalize or s.do_rescale) else np.float32

    def finish(
        self, image: np.ndarray, raw_pixels: bool, out: np.ndarray | None = None
    ) -> np.ndarray:
        """HWC uint8 to CHW: uint8 untouched when raw, else rescaled/normalized float32.

        Written into `out` (CHW, of `out_dtype`) when given. The float math runs on the CHW
        layout, per channel plane, rather than on HWC's innermost axis of 3: the same float32
        operations per element, far fewer (and longer) inner loops.
        """
        if out is None:
            out = np.empty((image.shape[2], *image.shape[:2]), self.out_dtype(raw_pixels))
        if self.out_dtype(raw_pixels) is np.uint8:
            return _planes(image, out)
        # contiguous planes: the float math runs twice as fast on them
        return self.normalize(_planes(image), out)

    def normalize(self, planes: np.ndarray, out: np.ndarray) -> np.ndarray:
        """uint8 channel planes (..., 3, H, W) to rescaled/normalized float32, into `out`."""
        s = self.settings
        if s.do_normalize:
            np.subtract(planes, self._mean[:, None, None], out=out, dtype=np.float32)
            np.divide(out, self._std[:, None, None], out=out)
        else:
            np.multiply(planes, np.float32(s.rescale_factor), out=out, dtype=np.float32)
        return out

    def square_pad(self, image: np.ndarray) -> np.ndarray:
        """LlavaImageProcessor.pad_to_square: centred, filled with the mean colour."""
        h, w = image.shape[:2]
        if h == w:
            return image
        side = max(h, w)
        left, top = (side - w) // 2, (side - h) // 2
        fill = tuple(int(x * 255) for x in self.settings.mean)
        return pad(image, left, top, side - w - left, side - h - top, fill)


def _planes(image: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """HWC uint8 to CHW uint8, into `out` if given; else, without the native kernels, a
    transposed view."""
    if native.AVAILABLE and image.ndim == 3 and image.shape[2] == 3:
        return native.chw(image, out)
    if out is None:
        return image.transpose(2, 0, 1)
    out[...] = image.transpose(2, 0, 1)
    return out


class LlavaProcessor(ImageProcessor):
    family = "llava"
    placeholder_text = "<image>"

    def __init__(self, pixels: PixelSettings, tower: TowerSettings) -> None:
        self.pixels = PixelPipeline(pixels)
        self.tower = tower

    @classmethod
    def matches(cls, files: ModelFiles) -> bool:
        return family_matches(files, MODEL_TYPES, IMAGE_PROCESSORS)

    @classmethod
    def from_files(cls, files: ModelFiles) -> LlavaProcessor:
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

    def resolve_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        return no_options(options, "LLaVA")

    def process(
        self, images: Sequence[np.ndarray], options: Mapping[str, Any], raw_pixels: bool
    ) -> ProcessedImages:
        self.resolve_options(options)
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
        return ProcessedImages(
            tensors={"pixel_values": pixel_values},
            batched_keys=("pixel_values",),
            replacements=[[token] * self.num_image_tokens(i.shape[0], i.shape[1]) for i in images],
        )


def _triple(values: Any) -> tuple[float, float, float]:
    if isinstance(values, (int, float)):
        return (float(values),) * 3
    values = tuple(float(v) for v in values)
    if len(values) != 3:
        raise ModelConfigError(f"expected 3 channel values, got {values}")
    return values
