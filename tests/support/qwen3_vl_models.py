"""Tiny Qwen3-VL model directories (dense `qwen3_vl` and MoE `qwen3_vl_moe`), written at test time.

Qwen3-VL: a Qwen3 decoder with interleaved M-RoPE under a vision tower of patch 16, merge 2,
with deepstack features fed into early decoder layers. Its chat template writes images and
videos as Qwen3.5's does, so the template is the tiny Qwen3.5 one; the tokenizer is the tiny
Qwen one (`engine_server.tiny_models`). The image preprocessor config is the released
checkpoints' (Qwen/Qwen3-VL-*), the video one (video_preprocessor_config.json) too: 4 Ki to
24 Mi pixels per clip, 2 fps, 4 to 768 frames.
"""

from __future__ import annotations

import json
from pathlib import Path

from engine_server import tiny_models as tm
from tests.support.qwen35_models import CHAT_TEMPLATE, PREPROCESSOR, TINY_PIXELS

MODEL_TYPES = ("qwen3_vl", "qwen3_vl_moe")
# The released video_preprocessor_config.json of Qwen/Qwen3-VL-*.
VIDEO_PREPROCESSOR = {
    "video_processor_type": "Qwen3VLVideoProcessor",
    "processor_class": "Qwen3VLProcessor",
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "do_sample_frames": True,
    "fps": 2,
    "min_frames": 4,
    "max_frames": 768,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "merge_size": 2,
    "patch_size": 16,
    "temporal_patch_size": 2,
    "resample": 3,
    "rescale_factor": 1 / 255,
    "return_metadata": False,
    "size": {"longest_edge": 25165824, "shortest_edge": 4096},
}


def _configs(tokenizer, moe: bool) -> dict:
    ids = tm.token_ids(tokenizer, tm.QWEN_SPECIAL_TOKENS)
    text = {
        **tm.text_config_kwargs(tokenizer),
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,  # the smallest vLLM's CPU attention takes
        "max_position_embeddings": 4096,
        "initializer_range": 0.05,
        # 16 rotary pairs over (t, h, w), interleaved as the released 24/20/20 of 64
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 5_000_000,
            "mrope_section": [6, 5, 5],
            "mrope_interleaved": True,
        },
    }
    text.pop("rope_theta", None)
    if moe:
        text.update(
            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, decoder_sparse_step=1
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
            "deepstack_visual_indexes": [0],
            "initializer_range": 1.0,
        },
        "image_token_id": ids[tm.IMAGE_PAD],
        "video_token_id": ids[tm.VIDEO_PAD],
        "vision_start_token_id": ids[tm.VISION_START],
        "vision_end_token_id": ids[tm.VISION_END],
        "tie_word_embeddings": False,
    }


def build_model(out_dir: Path, moe: bool = False, video: dict | None = None) -> Path:
    """A Qwen3-VL dir with random weights; images capped at 64 merged patches, videos with
    the released settings updated by `video`."""
    from transformers import (
        Qwen3VLConfig,
        Qwen3VLForConditionalGeneration,
        Qwen3VLMoeConfig,
        Qwen3VLMoeForConditionalGeneration,
    )

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = tm.qwen_tokenizer(CHAT_TEMPLATE)
    config = (Qwen3VLMoeConfig if moe else Qwen3VLConfig)(**_configs(tokenizer, moe))
    config.dtype = "float32"
    cls = Qwen3VLMoeForConditionalGeneration if moe else Qwen3VLForConditionalGeneration
    model = tm.seeded_model(lambda: cls(config))
    tm.save_decoder(model, tokenizer, out_dir, CHAT_TEMPLATE)
    pre = {**PREPROCESSOR, "size": TINY_PIXELS}
    (out_dir / "preprocessor_config.json").write_text(json.dumps(pre, indent=2) + "\n")
    video_pre = {**VIDEO_PREPROCESSOR, **(video or {})}
    (out_dir / "video_preprocessor_config.json").write_text(json.dumps(video_pre, indent=2) + "\n")
    return out_dir
