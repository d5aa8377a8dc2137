"""Tiny Qwen3.5 model directories (dense `qwen3_5` and MoE `qwen3_5_moe`), written at test time.

Qwen3.5 is a hybrid: Gated-DeltaNet linear-attention layers interleaved with full attention,
M-RoPE over a quarter of each head, under the Qwen3-VL vision tower (patch 16, merge 2).
Its image preprocessing is Qwen3-VL's (`Qwen3VLProcessor`), so the gateway serves it with the
Qwen-VL family file. vLLM 0.32 on a CPU runs it in bfloat16 only (its linear-attention
kernels), and only with a linear-attention key/value head dim of 128.

The tokenizer is the tiny Qwen one (`engine_server.tiny_models`), the chat template a
shortened Qwen3.5 template with its image and video structure, the preprocessor config the
released checkpoints' values (Qwen/Qwen3.5-*: patch 16, merge 2, mean/std 0.5, 64 Ki to
16 Mi pixels).
"""

from __future__ import annotations

import json
from pathlib import Path

from engine_server import tiny_models as tm

MODEL_TYPES = ("qwen3_5", "qwen3_5_moe")
# Qwen3.5's template, its tool and thinking branches left out: each image is written as
# <|vision_start|><|image_pad|><|vision_end|> where its part is.
CHAT_TEMPLATE = """\
{%- for message in messages %}
    {{- '<|im_start|>' + message.role + '\\n' }}
    {%- if message.content is string %}
        {{- message.content }}
    {%- else %}
        {%- for content in message.content %}
            {%- if content.type == 'image' or 'image' in content or 'image_url' in content %}
                {{- '<|vision_start|><|image_pad|><|vision_end|>' }}
            {%- elif content.type == 'video' or 'video' in content %}
                {{- '<|vision_start|><|video_pad|><|vision_end|>' }}
            {%- elif 'text' in content %}
                {{- content.text }}
            {%- endif %}
        {%- endfor %}
    {%- endif %}
    {{- '<|im_end|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}"""
# The released preprocessor_config.json of Qwen/Qwen3.5-* (as Qwen3-VL's).
PREPROCESSOR = {
    "image_processor_type": "Qwen2VLImageProcessorFast",
    "processor_class": "Qwen3VLProcessor",
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "size": {"shortest_edge": 65536, "longest_edge": 16777216},
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "do_convert_rgb": True,
    "resample": 3,
}
# Small images keep the e2e prompts short: at most 64 merged patches (256 patches of 16 px).
TINY_PIXELS = {"shortest_edge": 32 * 32 * 4, "longest_edge": 32 * 32 * 64}


def _configs(tokenizer, moe: bool) -> dict:
    ids = tm.token_ids(tokenizer, tm.QWEN_SPECIAL_TOKENS)
    text = {
        **tm.text_config_kwargs(tokenizer),
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "layer_types": ["linear_attention", "full_attention"],
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,
        # vLLM's CPU Gated-DeltaNet kernel takes 128 only.
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_num_key_heads": 1,
        "linear_num_value_heads": 1,
        "max_position_embeddings": 4096,
        # Small text weights under large vision ones: greedy answers then follow the image
        # (measured: at 0.15/0.15 every image gave the same text).
        "initializer_range": 0.05,
        # a quarter of 64: 16 rotary dims, 8 pairs split over (t, h, w) as the released 11/11/10
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10_000_000,
            "partial_rotary_factor": 0.25,
            "mrope_section": [3, 3, 2],
            "mrope_interleaved": True,
        },
    }
    text.pop("rope_theta", None)
    if moe:
        text.update(
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=64,
            shared_expert_intermediate_size=64,
        )
    return {
        "text_config": text,
        "vision_config": {
            "depth": 2,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_heads": 2,  # head_dim 32
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "out_hidden_size": 128,
            "num_position_embeddings": 256,
            "initializer_range": 1.0,
        },
        "image_token_id": ids[tm.IMAGE_PAD],
        "video_token_id": ids[tm.VIDEO_PAD],
        "vision_start_token_id": ids[tm.VISION_START],
        "vision_end_token_id": ids[tm.VISION_END],
        "tie_word_embeddings": False,
    }


def build_model(out_dir: Path, weights: bool = True, moe: bool = False, tiny: bool = True) -> Path:
    """A Qwen3.5 dir; `tiny` caps images at 64 merged patches (else the released limits)."""
    from transformers import Qwen3_5Config, Qwen3_5MoeConfig

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = tm.qwen_tokenizer(CHAT_TEMPLATE)
    config = (Qwen3_5MoeConfig if moe else Qwen3_5Config)(**_configs(tokenizer, moe))
    config.dtype = "bfloat16"
    if weights:
        from transformers import Qwen3_5ForConditionalGeneration, Qwen3_5MoeForConditionalGeneration

        cls = Qwen3_5MoeForConditionalGeneration if moe else Qwen3_5ForConditionalGeneration
        model = tm.seeded_model(lambda: cls(config))
        tm.save_decoder(model, tokenizer, out_dir, CHAT_TEMPLATE)
    else:
        config.save_pretrained(out_dir)
        tm.save_tokenizer(tokenizer, out_dir, CHAT_TEMPLATE)
    size = TINY_PIXELS if tiny else PREPROCESSOR["size"]
    pre = {**PREPROCESSOR, "size": size}
    (out_dir / "preprocessor_config.json").write_text(json.dumps(pre, indent=2) + "\n")
    return out_dir
