"""How many embedding slots each preprocessed item must have, asked of vLLM's own processor.

A placeholder whose embedding positions do not match what the encoder produces for the item
kills vLLM's engine core, so the worker checks it before admission. The count comes from the
model's own prompt-replacement rule in vLLM (e.g. Qwen2-VL: t*h*w / merge^2 pads), computed
from the item's tensors: no model knowledge lives here. A rule that asks for the raw media's
size (Pixtral's, LLaVA-NeXT's) is handed blank stand-ins of the size an item's `image_sizes`
(height, width: the HF processors' name) says, and blank clips of a video's frame count and
size where its pixels are frames (LLaVA-OneVision's); models whose rule needs more are
admitted unchecked, unless the count is in their tensors (_PER_ITEM_TENSOR: Gemma 3,
Idefics3, SmolVLM; _POOLED_POSITIONS: Gemma 4; _GRID_TENSOR: Kimi-K2.5; _VIDEO_GRID:
GLM-4.1V's videos).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from vllm.multimodal.inputs import MultiModalKwargsItems, PlaceholderRange
from vllm.multimodal.parse import ImageProcessorItems, MultiModalDataItems, VideoProcessorItems

from engine_server.errors import InvalidRequest

log = logging.getLogger("mmgate.engine")

# Rules vLLM cannot apply on the worker, with the count in the item's tensors instead: model
# type -> (per-item tensor, config field); slots = the tensor's value x the field. Gemma 3's
# rule counts pan-and-scan crops from the image size and the request's mm_processor_kwargs,
# neither of which reaches the worker (stand-ins would count with pan-and-scan off), while
# `num_patches` (crops + 1) says how many images its encoder embeds, each into
# mm_tokens_per_image slots.
_PER_ITEM_TENSOR = {"gemma3": ("num_patches", "mm_tokens_per_image")}
# Idefics3's and SmolVLM's rule counts tiles from the image size and the request's kwargs as
# well; its get_num_image_tokens is `num_patches` (tiles + 1) x the HF processor's
# image_seq_len, a field the model config lacks (_per_unit reads it from the processor).
_PER_ITEM_TENSOR.update(dict.fromkeys(("idefics3", "smolvlm"), ("num_patches", "image_seq_len")))
# Gemma 4's rule sizes the replacement from the raw image and the request's max_soft_tokens,
# neither of which reaches the worker; its encoder embeds one token per pooling x pooling block
# of patch positions (the vision pooler's count: padding, at (-1, -1), falls in block 0).
# model type -> (per-item positions tensor, vision config field).
_POOLED_POSITIONS = {"gemma4": ("pixel_position_ids", "pooling_kernel_size")}
# Likewise, with the count in a grid tensor: model type -> the item's (t, h, w) patch grid.
# Kimi-K2.5's rule sizes the replacement from the raw image (media_tokens_calculator); its
# tower merges h x w patches by vision_config.merge_kernel_size (pooling over t), so an item
# has h * w / (kh * kw) slots. A grid the merge does not divide, or one that is not the
# item's patch count, would fail inside the tower: refused here.
_GRID_TENSOR = {"kimi_k25": "grid_thws"}
# GLM-4.1V's video rule (_construct_video_placeholder) writes per-frame-pair timestamps read
# from the raw video's metadata, which never reaches the worker; its embeddings are the
# `<|image|>` slots, h*w / merge^2 per pair of frames: t*h*w / merge^2 from the item's grid.
_VIDEO_GRID = dict.fromkeys(("glm4v", "glm4v_moe"), "video_grid_thw")


class EmbeddingSlots:
    def __init__(self, engine: Any) -> None:
        self._processor = getattr(engine.renderer, "mm_processor", None)
        self._tokenizer = engine.tokenizer
        config = getattr(getattr(engine, "model_config", None), "hf_config", None)
        rule = _PER_ITEM_TENSOR.get(getattr(config, "model_type", None))
        per_unit = self._per_unit(config, rule[1]) if rule else None
        self._per_item = (rule[0], per_unit) if per_unit is not None else None
        pooled = _POOLED_POSITIONS.get(getattr(config, "model_type", None))
        vision = getattr(config, "vision_config", None)
        self._pooled = (pooled[0], int(getattr(vision, pooled[1]))) if pooled else None

        grid = _GRID_TENSOR.get(getattr(config, "model_type", None))
        self._grid = (grid, tuple(config.vision_config.merge_kernel_size)) if grid else None
        video_grid = _VIDEO_GRID.get(getattr(config, "model_type", None))
        self._video_grid = (
            (video_grid, int(getattr(vision, "spatial_merge_size", 2))) if video_grid else None
        )

    def _per_unit(self, config: Any, field: str) -> int | None:
        """Slots per unit of the tensor: the model config's `field`, else vLLM's HF
        processor's (None, checking nothing, if neither has it)."""
        value = getattr(config, field, None)
        if value is None and self._processor is not None:
            value = getattr(self._processor.info.get_hf_processor(), field, None)
        return None if value is None else int(value)

    def check(
        self, mm_kwargs: MultiModalKwargsItems, placeholders: dict[str, list[PlaceholderRange]]
    ) -> None:
        for modality, ranges in placeholders.items():
            for index, placeholder in enumerate(ranges):
                expected = self._expected(mm_kwargs, modality, index)
                got = placeholder.get_num_embeds()
                if expected is not None and got != expected:
                    raise InvalidRequest(
                        f"mm_placeholders: {modality} item {index} has {got} embedding positions, "
                        f"but the model's encoder produces {expected} for its tensors"
                    )

    def _expected(self, mm_kwargs: MultiModalKwargsItems, modality: str, index: int) -> int | None:
        if self._per_item is not None:
            key, slots = self._per_item
            item = mm_kwargs[modality][index]
            return int(item[key].data) * slots if key in item else None
        if self._pooled is not None:
            key, kernel = self._pooled
            item = mm_kwargs[modality][index]
            return _pooled_blocks(item[key].data, kernel) if key in item else None
        if self._grid is not None:
            return _grid_slots(mm_kwargs[modality][index], *self._grid, f"{modality} item {index}")
        if self._video_grid is not None and modality == "video":
            key, merge = self._video_grid
            item = mm_kwargs[modality][index]
            return int(item[key].data.prod()) // merge**2 if key in item else None
        if self._processor is None:
            return None
        try:
            media = _stand_ins(mm_kwargs)
            updates = self._processor._get_prompt_updates(media, {}, mm_kwargs)
            update = next(u for u in updates if u.modality == modality)
            content = update.resolve(index).content
        except Exception as error:  # noqa: BLE001 - the rule needs what we do not have
            log.debug("cannot count %s embedding slots from tensors: %s", modality, error)
            return None
        full = content.full
        if isinstance(full, str):
            full = self._tokenizer.encode(full, add_special_tokens=False)
        if content.is_embed is None:
            return len(full)
        return int(content.is_embed(full).sum())


def _pooled_blocks(positions: Any, kernel: int) -> int:
    """Gemma4VisionPooler's output count for one item's (patches, 2) positions: the distinct
    kernel x kernel blocks the (x, y) positions fall in, padding clamped to (0, 0)."""
    clamped = positions.clamp(min=0)
    blocks = clamped // kernel
    row = (clamped[:, 0].max() + 1) // kernel  # blocks per row, as the pooler numbers them
    return int((blocks[:, 0] + row * blocks[:, 1]).unique().numel())


def _grid_slots(item: Any, key: str, merge: tuple[int, int], where: str) -> int | None:
    if key not in item:
        return None
    t, h, w = (int(x) for x in item[key].data.flatten().tolist())
    pixels = item.get("pixel_values")
    rows = None if pixels is None else int(pixels.data.shape[0])
    if h % merge[0] or w % merge[1] or rows not in (None, t * h * w):
        raise InvalidRequest(
            f"mm_inputs: {where} has a {key} of {[t, h, w]} for {rows} patches; the model's "
            f"tower takes t*h*w patches with h and w multiples of {list(merge)}"
        )
    return h * w // (merge[0] * merge[1])


def _stand_ins(mm_kwargs: MultiModalKwargsItems) -> MultiModalDataItems:
    """Blank images (no memory: a broadcast zero) of the sizes the items' `image_sizes` say,
    for rules that size the replacement from the image; media-less items when one has no size.
    Videos whose pixels are frames, (frames, 3, H, W) (LLaVA-OneVision's), get blank clips of
    that many frames of that size, for rules that count frames."""
    data: dict[str, Any] = {}
    videos = [item.get("pixel_values_videos") for item in mm_kwargs.get("video", [])]
    if videos and all(v is not None and v.data.ndim == 4 for v in videos):
        blank = np.zeros((1, 1, 1, 3), np.uint8)
        shapes = [v.data.shape for v in videos]
        data["video"] = VideoProcessorItems(
            [np.broadcast_to(blank, (int(f), int(h), int(w), 3)) for f, _, h, w in shapes]
        )
    images = _image_stand_ins(mm_kwargs)
    if images is not None:
        data["image"] = images
    return MultiModalDataItems(data)


def _image_stand_ins(mm_kwargs: MultiModalKwargsItems) -> ImageProcessorItems | None:
    sizes = [item.get("image_sizes") for item in mm_kwargs.get("image", [])]
    if not sizes:
        return None
    if any(size is None or size.data.numel() != 2 for size in sizes):
        # vLLM's own stand-in for images whose media is not at hand (cached by uuid): a rule
        # that only asks whether they are images or embeddings (InternVL's) can count.
        return ImageProcessorItems([None] * len(sizes))
    blank = np.zeros((1, 1, 3), np.uint8)
    return ImageProcessorItems(
        [np.broadcast_to(blank, (*map(int, s.data.tolist()), 3)) for s in sizes]
    )
