"""The tiny Qwen2 chat model and Qwen2-VL vision model, and their tokenizer and decoder pieces
that other tiny Qwen-like models (tests/support) reuse."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine_server.tiny_models.chat_templates import QWEN2_CHAT_TEMPLATE, QWEN2_VL_CHAT_TEMPLATE
from engine_server.tiny_models.files import (
    save_model,
    save_processor,
    save_tokenizer,
    seeded_model,
    write_json,
)
from engine_server.tiny_models.tokenizer import fast_tokenizer, token_ids

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"
# Text and vision share one vocabulary (as real Qwen2 does), so ids line up.
QWEN_SPECIAL_TOKENS = (
    ENDOFTEXT,
    IM_START,
    IM_END,
    VISION_START,
    VISION_END,
    IMAGE_PAD,
    VIDEO_PAD,
)

# Shared decoder dims. head_dim = 128 / 4 = 32 is the smallest size vLLM's CPU
# attention kernels accept.
TEXT_DIMS: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-6,
    # Wide weights: at the usual 0.02 a random model repeats one token forever; at 0.5 greedy
    # output is varied text, split multi-byte characters included, which tests need.
    "initializer_range": 0.5,
}

# Caps an image at 256 14px patches = 64 LLM tokens after the 2x2 merge, so
# profiling and requests stay fast; min is Qwen's usual 56*56.
MIN_PIXELS = 56 * 56
MAX_PIXELS = 28 * 28 * 64


def qwen_tokenizer(chat_template: str) -> Any:
    """The tiny Qwen tokenizer (QWEN_SPECIAL_TOKENS, ends a turn at <|im_end|>) with
    `chat_template`."""
    return fast_tokenizer(
        QWEN_SPECIAL_TOKENS,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        chat_template=chat_template,
        model_max_length=TEXT_DIMS["max_position_embeddings"],
    )


def text_config_kwargs(tokenizer: Any) -> dict[str, Any]:
    """A Qwen-like decoder config's arguments: TEXT_DIMS plus the vocabulary size and the
    bos/eos/pad ids of `tokenizer` (a qwen_tokenizer)."""
    ids = token_ids(tokenizer, (ENDOFTEXT, IM_END))
    return {
        **TEXT_DIMS,
        "vocab_size": len(tokenizer),
        "bos_token_id": ids[ENDOFTEXT],
        "eos_token_id": ids[IM_END],
        "pad_token_id": ids[ENDOFTEXT],
    }


def save_decoder(model: Any, tokenizer: Any, out_dir: Path, template: str) -> None:
    """A Qwen-like decoder's weights (a turn ends at <|im_end|> or <|endoftext|>) and its
    tokenizer (a qwen_tokenizer) with `template` into `out_dir`."""
    ids = token_ids(tokenizer, (ENDOFTEXT, IM_END))
    save_model(
        model,
        out_dir,
        bos_token_id=ids[ENDOFTEXT],
        eos_token_id=[ids[IM_END], ids[ENDOFTEXT]],
        pad_token_id=ids[ENDOFTEXT],
    )
    save_tokenizer(tokenizer, out_dir, template)


def build_text_model(out_dir: Path) -> Path:
    """Tiny Qwen2ForCausalLM chat model with a ChatML + tools template."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = qwen_tokenizer(QWEN2_CHAT_TEMPLATE)
    config = Qwen2Config(
        **text_config_kwargs(tokenizer),
        tie_word_embeddings=True,
        dtype="float32",
    )
    model = seeded_model(lambda: Qwen2ForCausalLM(config))
    save_decoder(model, tokenizer, out_dir, QWEN2_CHAT_TEMPLATE)
    return out_dir


def build_vision_model(out_dir: Path) -> Path:
    """Tiny Qwen2VLForConditionalGeneration plus a Qwen2VLProcessor."""
    from transformers import (
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
    )

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = qwen_tokenizer(QWEN2_VL_CHAT_TEMPLATE)
    ids = token_ids(tokenizer, QWEN_SPECIAL_TOKENS)
    text = text_config_kwargs(tokenizer)
    rope_theta = text.pop("rope_theta")
    # M-RoPE splits the head_dim/2 = 16 rotary pairs across (t, h, w).
    text["rope_parameters"] = {
        "rope_type": "default",
        "rope_theta": rope_theta,
        "mrope_section": [4, 6, 6],
    }
    config = Qwen2VLConfig(
        text_config=text,
        vision_config={
            "depth": 2,
            "embed_dim": 64,
            "num_heads": 2,  # head_dim 32, same CPU attention constraint
            "mlp_ratio": 4,
            "hidden_size": TEXT_DIMS["hidden_size"],  # merger projects into the LLM
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
        image_token_id=ids[IMAGE_PAD],
        video_token_id=ids[VIDEO_PAD],
        vision_start_token_id=ids[VISION_START],
        vision_end_token_id=ids[VISION_END],
        tie_word_embeddings=True,
        dtype="float32",
    )
    model = seeded_model(lambda: Qwen2VLForConditionalGeneration(config))
    save_decoder(model, tokenizer, out_dir, QWEN2_VL_CHAT_TEMPLATE)

    size = {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS}
    processor = Qwen2VLProcessor(
        image_processor=Qwen2VLImageProcessor(size=size),
        video_processor=Qwen2VLVideoProcessor(size=size),
        tokenizer=tokenizer,
        chat_template=QWEN2_VL_CHAT_TEMPLATE,
    )
    save_processor(processor, tokenizer, out_dir, QWEN2_VL_CHAT_TEMPLATE)  # tokenizer files too
    _write_legacy_preprocessor_configs(processor, out_dir)
    return out_dir


def _write_legacy_preprocessor_configs(processor: Any, out_dir: Path) -> None:
    # transformers 5 nests both processors in processor_config.json; transformers
    # 4.x and hand-rolled preprocessors read these flat files with the
    # min_pixels/max_pixels spelling instead.
    pixels = {"min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS}
    for name, sub in (
        ("preprocessor_config.json", processor.image_processor),
        ("video_preprocessor_config.json", processor.video_processor),
    ):
        write_json(out_dir / name, {**sub.to_dict(), **pixels})
