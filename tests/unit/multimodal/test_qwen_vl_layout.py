"""The Qwen-VL image layout keeps on the CPU what vLLM's field config keeps there: an item
whose placeholders are all prefix-cached reaches vLLM's model runner with its keep_on_cpu
fields only (vllm.multimodal.utils.strip_covered_mm_data), and M-RoPE positions read the grid
from them; without the flag a chat's later turn killed the engine (KeyError image_grid_thw)."""

from __future__ import annotations

import numpy as np
import torch
from vllm.model_executor.models.qwen2_vl import _create_qwen2vl_field_factory

from engine_server.tiny_models import ensure_model
from gateway.render.model_files import ModelFiles
from multimodal.registry import processors_for


def test_qwen_vl_images_keep_on_cpu_what_vllm_keeps():
    processor = processors_for(ModelFiles.load(ensure_model("vision"))).get("image")
    image = np.random.default_rng(0).integers(0, 256, (56, 84, 3), dtype=np.uint8)
    processed = processor.process([image], processor.defaults, False)
    hf = {k: torch.from_numpy(np.asarray(v)) for k, v in processed.tensors.items()}
    fields = _create_qwen2vl_field_factory(2)(hf)
    theirs = {k for k, f in fields.items() if f.field.keep_on_cpu and k in processed.tensors}
    assert theirs == {"image_grid_thw"}
    assert set(processed.keep_on_cpu_keys) == theirs
