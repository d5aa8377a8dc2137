"""How many embedding slots each preprocessed item must have, asked of vLLM's own processor.

A placeholder whose embedding positions do not match what the encoder produces for the item
kills vLLM's engine core, so the worker checks it before admission. The count comes from the
model's own prompt-replacement rule in vLLM (e.g. Qwen2-VL: t*h*w / merge^2 pads), computed
from the item's tensors: no model knowledge lives here. Models whose rule needs the raw media
(an image size rather than a tensor) cannot be checked this way and are admitted unchecked.
"""

from __future__ import annotations

import logging
from typing import Any

from vllm.multimodal.inputs import MultiModalKwargsItems, PlaceholderRange
from vllm.multimodal.parse import MultiModalDataItems

from engine_server.errors import InvalidRequest

log = logging.getLogger("mmgate.engine")


class EmbeddingSlots:
    def __init__(self, engine: Any) -> None:
        self._processor = getattr(engine.renderer, "mm_processor", None)
        self._tokenizer = engine.tokenizer

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
        if self._processor is None:
            return None
        try:
            updates = self._processor._get_prompt_updates(MultiModalDataItems({}), {}, mm_kwargs)
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
