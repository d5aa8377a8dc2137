"""A tiny random-weight LFM2-VL model directory, for the "worker-side processing" fallback.

mmgate renders multimodal prompts itself only for the families it has a preprocessing file
for; any other vision-language model falls back to letting the engine worker run the
Hugging Face processor. LFM2-VL (Liquid AI, `lfm2_vl` / Lfm2VlForConditionalGeneration) is
a family we have no preprocessing file for and do not plan one for, so this model is what the
tests use to prove that the fallback answers exactly like vLLM's own OpenAI server.

The directory is built at test time (no hub access): an LFM2 hybrid decoder (one short-conv
layer, one attention layer) under a SigLIP2 NaFlex vision tower, seeded random weights, our
locally trained BPE with LFM2-VL's special tokens, the released checkpoint's chat template
and LFM2-VL-1.6B's image-processor settings, lowered so that prompts stay short: 256px tiles
(64 tokens each), at most 4 tiles plus a thumbnail, 16-64 tokens for a single-tile image.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

MODEL_TYPE = "lfm2_vl"
ARCHITECTURE = "Lfm2VlForConditionalGeneration"
# What the chat template writes per image, what vLLM's `get_placeholder_str` returns, and the
# token each image embedding replaces.
IMAGE_TOKEN = "<image>"
IMAGE_START = "<|image_start|>"
IMAGE_END = "<|image_end|>"
IMAGE_THUMBNAIL = "<|img_thumbnail|>"
PAD = "<|pad|>"
BOS = "<|startoftext|>"
ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
# Tile markers "<|img_row_R_col_C|>": the released vocabulary has them for a 10x10 grid.
GRID_SIDE = 10
TILE_TOKENS = tuple(
    f"<|img_row_{r}_col_{c}|>" for r in range(1, GRID_SIDE + 1) for c in range(1, GRID_SIDE + 1)
)
# Ids follow our BPE; as in the released vocabulary, `<image>` comes right before the markers.
SPECIAL_TOKENS = (
    PAD,
    BOS,
    ENDOFTEXT,
    IM_START,
    IM_END,
    IMAGE_TOKEN,
    *TILE_TOKENS,
    IMAGE_THUMBNAIL,
    IMAGE_START,
    IMAGE_END,
)

# LiquidAI/LFM2-VL-450M's chat_template.jinja as first released, verbatim: content parts are
# walked and each image part becomes one "<image>", which the processor expands.
CHAT_TEMPLATE = (
    "{{bos_token}}{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n'}}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}{{ '<image>' }}"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}"
    "{% endif %}{{'<|im_end|>\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{'<|im_start|>assistant\n' }}{% endif %}"
)

# The released processor settings (SigLIP2 mean/std 0.5, 16px patches, 2x2 pixel unshuffle,
# 2..N tiles for images over 2x the token budget) with the sizes scaled down: 256px tiles give
# 64 tokens each (the 16x16 patch grid matches the vision tower's position embeddings), 4 tiles
# at most, and a single-tile image or the thumbnail gets 16-64 tokens. Released: tile_size
# 512, max_tiles 10, min/max_image_tokens 64/256. The thumbnail is on (transformers' default;
# LFM2-VL-450M turns it off) so tiled prompts carry all of the placeholder structure.
IMAGE_PROCESSOR_KWARGS: dict[str, Any] = {
    "do_image_splitting": True,
    "do_normalize": True,
    "do_pad": True,
    "do_rescale": True,
    "do_resize": True,
    "downsample_factor": 2,
    "encoder_patch_size": 16,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "max_image_tokens": 64,
    "max_pixels_tolerance": 2.0,
    "max_tiles": 4,
    "min_image_tokens": 16,
    "min_tiles": 2,
    "resample": 2,  # bilinear
    "rescale_factor": 1 / 255,
    "size": {"height": 256, "width": 256},
    "tile_size": 256,
    "use_thumbnail": True,
}

# head_dim 32 in both towers (vLLM's CPU attention needs 32/64/80/...).
_TEXT: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "block_auto_adjust_ff_dim": False,
    "num_hidden_layers": 2,
    "layer_types": ["conv", "full_attention"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 8192,
    "norm_eps": 1e-5,
    "conv_L_cache": 3,
    "conv_bias": False,
    # Not Lfm2Config fields, but in every released config.json, and vLLM's Lfm2 reads them.
    "block_dim": 128,
    "conv_dim": 128,
    "conv_dim_out": 128,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0},
    # Also the projector's init. At 0.5 (engine_server.tiny_models' value) attention is
    # one-hot and the answer depends only on the last few prompt tokens, images ignored; at
    # 0.02 it repeats one token. At 0.15 greedy text is varied and changes with the image.
    "initializer_range": 0.15,
    "architectures": ["Lfm2ForCausalLM"],
}
_VISION: dict[str, Any] = {
    "model_type": "siglip2_vision_model",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_channels": 3,
    "num_patches": 256,  # 16x16 position grid, resized per image (NaFlex)
    "patch_size": 16,
    "hidden_act": "gelu_pytorch_tanh",
    "layer_norm_eps": 1e-6,
    "vision_use_head": False,
}


def build_fallback_model(out_dir: Path) -> Path:
    """Write the tiny LFM2-VL model (config, weights, tokenizer, processor) into `out_dir`."""
    from transformers import (
        Lfm2VlConfig,
        Lfm2VlForConditionalGeneration,
        Lfm2VlImageProcessor,
        Lfm2VlProcessor,
    )

    from engine_server.tiny_models import (
        fast_tokenizer,
        save_model,
        save_processor,
        seeded_model,
        token_ids,
    )

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = fast_tokenizer(
        SPECIAL_TOKENS,
        bos_token=BOS,
        eos_token=IM_END,
        pad_token=PAD,
        chat_template=CHAT_TEMPLATE,
        model_max_length=_TEXT["max_position_embeddings"],
    )
    ids = token_ids(tokenizer, (PAD, BOS, IM_END, IMAGE_TOKEN))
    text = {
        **_TEXT,
        "vocab_size": len(tokenizer),
        "bos_token_id": ids[BOS],
        "eos_token_id": ids[IM_END],
        "pad_token_id": ids[PAD],
        "tie_word_embeddings": True,
    }
    config = Lfm2VlConfig(
        text_config=text,
        vision_config=dict(_VISION),
        image_token_id=ids[IMAGE_TOKEN],
        projector_hidden_act="gelu",
        projector_hidden_size=128,
        projector_bias=True,
        projector_use_layernorm=True,
        downsample_factor=IMAGE_PROCESSOR_KWARGS["downsample_factor"],
        tie_word_embeddings=True,
        dtype="float32",
    )
    model = seeded_model(lambda: Lfm2VlForConditionalGeneration(config))
    save_model(
        model, out_dir, bos_token_id=ids[BOS], eos_token_id=ids[IM_END], pad_token_id=ids[PAD]
    )
    _rename_vision_weights(out_dir / "model.safetensors")

    image_processor = Lfm2VlImageProcessor(**IMAGE_PROCESSOR_KWARGS)
    processor = Lfm2VlProcessor(
        image_processor=image_processor, tokenizer=tokenizer, chat_template=CHAT_TEMPLATE
    )
    pre = {**image_processor.to_dict(), "processor_class": "Lfm2VlProcessor"}
    save_processor(processor, tokenizer, out_dir, CHAT_TEMPLATE, pre)
    return out_dir


def _rename_vision_weights(path: Path) -> None:
    # transformers 5 names the SigLIP2 tower's weights without the "vision_model." level
    # (and maps the old names on load); released checkpoints, and vLLM's loader, keep it.
    from safetensors.torch import load_file, save_file

    prefix = "model.vision_tower."
    weights = {
        (prefix + "vision_model." + k[len(prefix) :] if k.startswith(prefix) else k): v
        for k, v in load_file(path).items()
    }
    save_file(weights, path, metadata={"format": "pt"})
