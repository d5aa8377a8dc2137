"""vLLM's own video path, run offline: the reference the gateway's video families are held to.

`vllm_video_inputs` loads each clip with vLLM's MediaConnector (the loader vLLM's chat path
picks from the checkpoint's video processor class) and runs the model's multimodal processor
on the chat prompt, as `vllm serve` does for a chat with `video_url` parts. It returns the
prompt ids and every item's tensors, which the gateway's must equal exactly.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


def vllm_video_inputs(
    model: Path,
    videos: Sequence[str],
    images: Sequence[Any] = (),
    text: str = "Describe.",
    options: dict | None = None,
    **config: Any,
) -> dict[str, Any]:
    """{"prompt_token_ids": [...], "ranges": {modality: [(offset, length), ...]}, "dtype":
    the model's, "video": [{tensor name: array}, ...], "image": [...]} (bfloat16 tensors as
    float32 arrays of their values) for a user message of the images' parts, then the
    videos' (URLs: data: URIs), then `text`.
    `options`: mm_processor_kwargs; `config`: more of vLLM's ModelConfig."""
    from vllm.multimodal.processing.context import TimingContext
    from vllm.multimodal.processing.inputs import ProcessorInputs

    processor, connector, loader, tokenizer = _setup(model, config)
    loaded = [connector.fetch_video(url, video_processor=loader).media for url in videos]
    content = [{"type": "image"}] * len(images) + [{"type": "video"}] * len(videos)
    chat = [{"role": "user", "content": [*content, {"type": "text", "text": text}]}]
    prompt = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    data: dict[str, list[Any]] = {"video": loaded}
    if images:
        data["image"] = list(images)
    items = processor.info.parse_mm_data(data)
    inputs = ProcessorInputs(ids, items, hf_processor_mm_kwargs=options or {})
    out = processor.apply(inputs, TimingContext(enabled=False))
    # Floating tensors come out in the model's dtype (vLLM casts them after its processor; our
    # engine casts the wire's float32 the same way): "dtype" says which.
    result: dict[str, Any] = {
        "prompt_token_ids": list(out["prompt_token_ids"]),
        "ranges": {
            modality: [(p.offset, p.length) for p in ranges]
            for modality, ranges in out["mm_placeholders"].items()
        },
        "dtype": str(processor.info.ctx.model_config.dtype).removeprefix("torch."),
    }
    for modality, kwargs_items in out["mm_kwargs"].items():
        result[modality] = [
            {key: _array(element.data) for key, element in item.items()} for item in kwargs_items
        ]
    return result


# (model, ModelConfig kwargs) -> vLLM's processor, media connector, loader name and tokenizer:
# made once per test session (a few seconds each), as a server makes them once.
_SETUPS: dict[str, tuple[Any, Any, Any, Any]] = {}


def _setup(model: Path, config: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    key = json.dumps([str(model), config], sort_keys=True, default=str)
    if key not in _SETUPS:
        from transformers import AutoTokenizer
        from vllm.config import ModelConfig
        from vllm.multimodal import MULTIMODAL_REGISTRY
        from vllm.multimodal.media.connector import MediaConnector
        from vllm.transformers_utils.processor import get_video_processor_cls_name

        model_config = ModelConfig(model=str(model), **config)
        media_io_kwargs = model_config.get_multimodal_config().media_io_kwargs
        _SETUPS[key] = (
            MULTIMODAL_REGISTRY.create_processor(model_config),
            MediaConnector(media_io_kwargs=media_io_kwargs),
            get_video_processor_cls_name(model_config),
            AutoTokenizer.from_pretrained(model),
        )
    return _SETUPS[key]


def _array(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        if value.dtype == torch.bfloat16:
            value = value.float()
        return value.numpy()
    if isinstance(value, list):
        return np.asarray(value)
    return value
