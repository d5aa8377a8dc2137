"""A tiny Qwen2.5-VL model directory, written at test time.

Qwen2.5-VL is Qwen2-VL's processing (Qwen2VLImageProcessor and Qwen2VLVideoProcessor) under
another vision tower (window attention, SwiGLU) and with `second_per_grid_ts` on videos, which
its M-RoPE time axis reads (`tokens_per_second`). The tokenizer, decoder dims and template are
the tiny Qwen2-VL's (`engine_server.tiny_models.qwen`), so only the config and the tower
differ.
"""

from __future__ import annotations

from pathlib import Path


def build_model(out_dir: Path) -> Path:
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2_5_VLProcessor,
        Qwen2VLImageProcessor,
        Qwen2VLVideoProcessor,
    )

    from engine_server import tiny_models as tm
    from engine_server.tiny_models import qwen

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    template = tm.QWEN2_VL_CHAT_TEMPLATE
    tokenizer = qwen.qwen_tokenizer(template)
    ids = tm.token_ids(tokenizer, qwen.QWEN_SPECIAL_TOKENS)
    text = qwen.text_config_kwargs(tokenizer)
    rope_theta = text.pop("rope_theta")
    text["rope_parameters"] = {
        "rope_type": "default",
        "rope_theta": rope_theta,
        "mrope_section": [4, 6, 6],
    }
    config = Qwen2_5_VLConfig(
        text_config=text,
        vision_config={
            "depth": 2,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_heads": 2,
            "out_hidden_size": qwen.TEXT_DIMS["hidden_size"],
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "tokens_per_second": 2,
            "window_size": 56,
            "fullatt_block_indexes": [1],
        },
        image_token_id=ids[qwen.IMAGE_PAD],
        video_token_id=ids[qwen.VIDEO_PAD],
        vision_start_token_id=ids[qwen.VISION_START],
        vision_end_token_id=ids[qwen.VISION_END],
        tie_word_embeddings=True,
        dtype="float32",
    )
    model = tm.seeded_model(lambda: Qwen2_5_VLForConditionalGeneration(config))
    qwen.save_decoder(model, tokenizer, out_dir, template)
    size = {"shortest_edge": qwen.MIN_PIXELS, "longest_edge": qwen.MAX_PIXELS}
    processor = Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessor(size=size),
        video_processor=Qwen2VLVideoProcessor(size=size),
        tokenizer=tokenizer,
        chat_template=template,
    )
    tm.save_processor(processor, tokenizer, out_dir, template)
    return out_dir
