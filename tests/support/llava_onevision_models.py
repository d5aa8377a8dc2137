"""A tiny LLaVA-OneVision model directory (`llava_onevision`, vLLM's
LlavaOnevisionForConditionalGeneration), written at test time: a Qwen2 decoder under a SigLIP
tower, seeded random weights (optional), our locally trained BPE with Qwen2's and OneVision's
special tokens, the released checkpoint's chat template and llava-onevision-qwen2-*-ov-hf's
image-processor settings unchanged (384px tiles of 27x27 patches, the 36 pinpoints up to
2304px, SigLIP mean/std 0.5): an image costs 729 base tokens plus up to ~9 tiles' worth, so
prompts run to a few thousand tokens, which vLLM's CPU build handles.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

MODEL_TYPE = "llava_onevision"
IMAGE_TOKEN = "<image>"
VIDEO_TOKEN = "<video>"
ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
# As in the released vocabulary: Qwen2's specials, then <image> and <video> added after them.
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END, IMAGE_TOKEN, VIDEO_TOKEN)

# llava-hf/llava-onevision-qwen2-*-ov-hf's chat_template.json (transformers' conversion
# script), verbatim: all images of a message first, one "<image>\n" each, then its text.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n'}}"
    "{# Render all images first #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image>\n' }}{% endfor %}"
    "{# Render all video then #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'video') %}"
    "{{ '<video>\n' }}{% endfor %}"
    "{# Render all text next #}"
    "{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ content['text'] }}{% endfor %}"
    "{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ content['text'] }}{% endgeneration %}{% endfor %}"
    "{% endif %}{{'<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

PINPOINTS = [[384 * h, 384 * w] for h in range(1, 7) for w in range(1, 7)]
# The released preprocessor_config.json's values.
IMAGE_PROCESSOR_KWARGS: dict[str, Any] = {
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_pad": True,
    "do_rescale": True,
    "do_resize": True,
    "image_grid_pinpoints": PINPOINTS,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "resample": 3,  # bicubic
    "rescale_factor": 1 / 255,
    "size": {"height": 384, "width": 384},
}

# The released video_preprocessor_config.json's values: every frame resized to 384x384,
# bicubic, with the image processor's SigLIP mean/std (LlavaOnevisionVideoProcessor's class
# defaults are OpenAI CLIP's).
VIDEO_PROCESSOR_KWARGS: dict[str, Any] = {
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "resample": 3,
    "rescale_factor": 1 / 255,
    "size": {"height": 384, "width": 384},
}

# head_dim 32 in both towers (vLLM's CPU attention needs 32/64/80/...).
_TEXT: dict[str, Any] = {
    "model_type": "qwen2",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 16384,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0},
    # Also the projector's init: at 0.02 greedy decoding repeats one token (fallback_models).
    "initializer_range": 0.15,
    "tie_word_embeddings": False,
}
# The released tower's geometry (384px, 14px patches: a 27x27 grid), shrunk in width/depth.
_VISION: dict[str, Any] = {
    "model_type": "siglip_vision_model",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "image_size": 384,
    "patch_size": 14,
    "vision_use_head": False,
}


def build_model(out_dir: Path, weights: bool = True) -> Path:
    """Write the tiny model (config, weights when `weights`, tokenizer, processor) into
    `out_dir`."""
    from transformers import (
        LlavaOnevisionConfig,
        LlavaOnevisionImageProcessor,
        LlavaOnevisionProcessor,
        LlavaOnevisionVideoProcessor,
    )

    from engine_server.tiny_models import fast_tokenizer, save_processor, token_ids, write_json

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = fast_tokenizer(
        SPECIAL_TOKENS,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        chat_template=CHAT_TEMPLATE,
        model_max_length=_TEXT["max_position_embeddings"],
    )
    ids = token_ids(tokenizer, SPECIAL_TOKENS)
    text = {
        **_TEXT,
        "vocab_size": len(tokenizer),
        "eos_token_id": ids[IM_END],
        "pad_token_id": ids[ENDOFTEXT],
    }
    config = LlavaOnevisionConfig(
        text_config=text,
        vision_config=dict(_VISION),
        image_token_index=ids[IMAGE_TOKEN],
        video_token_index=ids[VIDEO_TOKEN],
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
        vision_aspect_ratio="anyres_max_9",
        image_grid_pinpoints=PINPOINTS,
        tie_word_embeddings=False,
        dtype="float32",
    )
    if weights:
        _save_weights(config, ids, out_dir)
    else:
        config.save_pretrained(out_dir)

    image_processor = LlavaOnevisionImageProcessor(**IMAGE_PROCESSOR_KWARGS)
    video_processor = LlavaOnevisionVideoProcessor(**VIDEO_PROCESSOR_KWARGS)
    processor = LlavaOnevisionProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        num_image_tokens=(_VISION["image_size"] // _VISION["patch_size"]) ** 2,
        vision_feature_select_strategy="full",
        vision_aspect_ratio="anyres_max_9",
        chat_template=CHAT_TEMPLATE,
    )
    pre = {**image_processor.to_dict(), "processor_class": "LlavaOnevisionProcessor"}
    save_processor(processor, tokenizer, out_dir, CHAT_TEMPLATE, pre)
    video_pre = {**video_processor.to_dict(), "processor_class": "LlavaOnevisionProcessor"}
    write_json(out_dir / "video_preprocessor_config.json", video_pre)
    return out_dir


def _save_weights(config: Any, ids: dict[str, int], out_dir: Path) -> None:
    from transformers import LlavaOnevisionForConditionalGeneration

    from engine_server.tiny_models import save_model, seeded_model

    model = seeded_model(lambda: LlavaOnevisionForConditionalGeneration(config))
    save_model(model, out_dir, eos_token_id=ids[IM_END], pad_token_id=ids[ENDOFTEXT])
    _rename_vision_weights(out_dir / "model.safetensors")


def _rename_vision_weights(path: Path) -> None:
    # transformers 5 saves the released top-level names (language_model.*, vision_tower.*) but
    # the SigLIP tower's without their "vision_model." level (and maps it back on load);
    # released checkpoints, and vLLM's loader, have vision_tower.vision_model.*.
    from safetensors.torch import load_file, save_file

    prefix = "vision_tower."
    nested = prefix + "vision_model."
    weights = {
        (nested + k[len(prefix) :] if k.startswith(prefix) and not k.startswith(nested) else k): v
        for k, v in load_file(path).items()
    }
    save_file(weights, path, metadata={"format": "pt"})
