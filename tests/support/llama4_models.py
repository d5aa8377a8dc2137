"""A tiny random-weight Llama 4 (`llama4` / Llama4ForConditionalGeneration) model directory.

Built at test time (no hub access): a Llama 4 text decoder of two layers (a chunked-attention
RoPE layer with a dense MLP, then a NoPE full-attention layer with a 4-expert MoE, as the
released checkpoints interleave them) under a one-layer Llama 4 vision tower, seeded random
weights, our locally trained BPE with Llama 4's special tokens, the released chat template
(transformers' copy of it: one `<|image|>` per image part) and the released image-processor
settings unchanged: 336px tiles, up to 16 tiles plus a global tile, mean/std 0.5, bilinear.

The tower keeps the released tile geometry (336px tiles of 14px patches, pixel shuffle 0.5:
144 tokens per tile), so a tiled image costs (tiles + 1) x 144 tokens plus its structure:
1,887 for a 1280x960 photo (3x4 tiles), at most 2.5k (16 tiles); give two-image requests
max_model_len 8192. Only the widths shrink: head dim 32 in both towers (vLLM's CPU
attention), under 6 MB in all. vLLM 0.32 on CPU cannot encode an image of a single tile
(tests/e2e/gateway/test_family_llama4.py says why and how its test avoids them).

`weights=False` writes everything but the weights (the processors' parity tests need no more).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

MODEL_TYPE = "llama4"
ARCHITECTURE = "Llama4ForConditionalGeneration"

BOS = "<|begin_of_text|>"
END_OF_TEXT = "<|end_of_text|>"
PAD = "<|finetune_right_pad|>"
HEADER_START = "<|header_start|>"
HEADER_END = "<|header_end|>"
EOM = "<|eom|>"
EOT = "<|eot|>"
PYTHON_START = "<|python_start|>"
PYTHON_END = "<|python_end|>"
IMAGE_START = "<|image_start|>"
IMAGE_END = "<|image_end|>"
TILE_X = "<|tile_x_separator|>"
TILE_Y = "<|tile_y_separator|>"
IMAGE = "<|image|>"  # what the chat template writes per image (and vLLM's placeholder)
PATCH = "<|patch|>"  # the image embeddings' token: config.image_token_index
# In the released vocabulary's order (ids follow our BPE, appended after it).
SPECIAL_TOKENS = (
    BOS,
    END_OF_TEXT,
    HEADER_START,
    HEADER_END,
    EOM,
    EOT,
    PYTHON_START,
    PYTHON_END,
    PAD,
    IMAGE_START,
    IMAGE_END,
    TILE_X,
    TILE_Y,
    IMAGE,
    PATCH,
)

# meta-llama/Llama-4-Scout-17B-16E-Instruct's preprocessor_config.json (the fast processor).
PREPROCESSOR: dict[str, Any] = {
    "crop_size": None,
    "data_format": "channels_first",
    "default_to_square": True,
    "device": None,
    "do_center_crop": None,
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_processor_type": "Llama4ImageProcessorFast",
    "image_std": [0.5, 0.5, 0.5],
    "input_data_format": None,
    "max_patches": 16,
    "processor_class": "Llama4Processor",
    "resample": 2,
    "rescale_factor": 0.00392156862745098,
    "resize_to_max_canvas": False,
    "return_tensors": None,
    "size": {"height": 336, "width": 336},
}

_TEXT: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 128,  # each expert's (and the shared expert's)
    "intermediate_size_mlp": 256,  # the dense layers'
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "num_local_experts": 4,
    "num_experts_per_tok": 1,
    # Layer 0 dense, layer 1 MoE (Maverick's interleaving; Scout has MoE everywhere).
    "interleave_moe_layer_step": 2,
    # Layer 0 RoPE with chunked local attention, layer 1 NoPE with global attention.
    "no_rope_layers": [1, 0],
    "attention_chunk_size": 8192,
    "use_qk_norm": True,
    "attn_temperature_tuning": True,
    "floor_scale": 8192,
    "attn_scale": 0.1,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
    # Greedy text from a random model falls into a loop of one or two tokens when one
    # context-independent direction dominates the last hidden state: with 0.15 here and in
    # the tower ("keep keep keep ..."), or when the image features are large. 0.2 here and
    # 0.02 in the tower give varied text that changes with the image.
    "initializer_range": 0.2,
}
# Released geometry (336px tiles, 14px patches, pixel shuffle 0.5), tiny widths: the pixel
# shuffle MLP takes intermediate_size = 4 x hidden_size inputs, as released (5632 = 4 x 1408).
_VISION: dict[str, Any] = {
    "image_size": 336,
    "patch_size": 14,
    "pixel_shuffle_ratio": 0.5,
    "hidden_size": 64,
    "num_attention_heads": 2,
    "intermediate_size": 256,
    "num_hidden_layers": 1,
    "vision_output_dim": 128,
    "projector_input_dim": 128,
    "projector_output_dim": 128,
    "multi_modal_projector_bias": False,
    "norm_eps": 1e-5,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "initializer_range": 0.02,
}


def chat_template() -> str:
    """The released chat template (transformers keeps a verbatim copy in Llama4Processor)."""
    from transformers.models.llama4 import processing_llama4

    return processing_llama4.chat_template


def build_model(out_dir: Path, weights: bool = True) -> Path:
    """Write the tiny Llama 4 (configs, tokenizer, processor, and weights if `weights`)."""
    from transformers import (
        Llama4Config,
        Llama4ImageProcessor,
        Llama4Processor,
    )

    from engine_server.tiny_models import fast_tokenizer, save_processor, token_ids

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    template = chat_template()
    tokenizer = fast_tokenizer(
        SPECIAL_TOKENS,
        bos_token=BOS,
        eos_token=EOT,
        pad_token=PAD,
        chat_template=template,
        model_max_length=_TEXT["max_position_embeddings"],
    )
    ids = token_ids(tokenizer, SPECIAL_TOKENS)
    eos = [ids[END_OF_TEXT], ids[EOM], ids[EOT]]  # as released: any of the three ends a turn
    text = {
        **_TEXT,
        "vocab_size": len(tokenizer),
        "bos_token_id": ids[BOS],
        "eos_token_id": eos,
        "pad_token_id": ids[PAD],
        "tie_word_embeddings": False,
    }
    config = Llama4Config(
        text_config=text,
        vision_config=dict(_VISION),
        boi_token_index=ids[IMAGE_START],
        eoi_token_index=ids[IMAGE_END],
        image_token_index=ids[PATCH],  # as released: the token image embeddings replace
        tie_word_embeddings=False,
        dtype="float32",
    )
    config.architectures = [ARCHITECTURE]
    if weights:
        _save_weights(config, out_dir, eos, ids)
    else:
        config.save_pretrained(out_dir)

    image_processor = Llama4ImageProcessor(
        **{k: v for k, v in PREPROCESSOR.items() if k not in _NOT_KWARGS}
    )
    processor = Llama4Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=_VISION["patch_size"],
        pixel_shuffle_ratio=_VISION["pixel_shuffle_ratio"],
        chat_template=template,
    )
    save_processor(processor, tokenizer, out_dir, template, PREPROCESSOR)
    return out_dir


# Keys of the released file that are not image-processor settings.
_NOT_KWARGS = ("image_processor_type", "processor_class")


def _save_weights(config: Any, out_dir: Path, eos: list[int], ids: dict[str, int]) -> None:
    from transformers import Llama4ForConditionalGeneration

    from engine_server.tiny_models import save_model, seeded_model

    model = seeded_model(lambda: Llama4ForConditionalGeneration(config))
    save_model(model, out_dir, bos_token_id=ids[BOS], eos_token_id=eos, pad_token_id=ids[PAD])
