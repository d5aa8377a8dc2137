"""A tiny random-weight InternVL model directory in Hugging Face format (`internvl`,
InternVLForConditionalGeneration; vLLM serves it with interns1.py), written at test time.

As OpenGVLab/InternVL3-1B-hf is laid out, scaled down: an InternViT-style vision tower
(InternVLVisionConfig) and a Qwen2 decoder, seeded random weights; our locally trained BPE with
the released added tokens (`<img>`, `</img>`, `<IMG_CONTEXT>`, `<video>`, the grounding tags) and
the released `extra_special_tokens` naming them; the released chat template (one
`<IMG_CONTEXT>` per image, which the processor expands to `<img>` + 256 x `<IMG_CONTEXT>` per
tile + `</img>`); and the released flat `preprocessor_config.json` unchanged: 448px tiles,
1..12 tiles plus a thumbnail, ImageNet mean/std, bicubic, and `crop_to_patches: false`, which
InternVLProcessor's own default (True) overrides at call time, so images are tiled. Nothing is
shrunk: an image is 256 to 3,328 tokens, so engines serving it need `max_model_len` 8192.

Head dims are 32 in both towers (vLLM's CPU attention); the files total a few MB.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MODEL_TYPE = "internvl"
ARCHITECTURE = "InternVLForConditionalGeneration"
IMG_START = "<img>"
IMG_END = "</img>"
IMG_CONTEXT = "<IMG_CONTEXT>"  # what the chat template writes per image, and each embedding
VIDEO = "<video>"
ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
# The released InternVL3 (Qwen2.5 tokenizer) added tokens the processor and template use, in
# their released order; ids follow our BPE.
SPECIAL_TOKENS = (
    ENDOFTEXT,
    IM_START,
    IM_END,
    IMG_START,
    IMG_END,
    IMG_CONTEXT,
    "<quad>",
    "</quad>",
    "<ref>",
    "</ref>",
    "<box>",
    "</box>",
    VIDEO,
)
# tokenizer_config.json's named tokens, as released (InternVLProcessor reads them).
EXTRA_SPECIAL_TOKENS = {
    "context_image_token": IMG_CONTEXT,
    "end_image_token": IMG_END,
    "start_image_token": IMG_START,
    "video_token": VIDEO,
}

# The released chat template (transformers' convert_internvl_weights_to_hf.py), verbatim.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n'}}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}{{ '<IMG_CONTEXT>\n' }}"
    "{% elif content['type'] == 'video' %}{{ '<video>\n' }}"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}"
    "{% endif %}{% endfor %}{% endif %}{{'<|im_end|>\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{'<|im_start|>assistant\n' }}{% endif %}"
)

# InternVL3-1B-hf's preprocessor_config.json (GotOcr2ImageProcessorFast), values unchanged.
PREPROCESSOR: dict[str, Any] = {
    "crop_size": None,
    "crop_to_patches": False,
    "data_format": "channels_first",
    "default_to_square": True,
    "device": None,
    "do_center_crop": None,
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.485, 0.456, 0.406],
    "image_processor_type": "GotOcr2ImageProcessorFast",
    "image_std": [0.229, 0.224, 0.225],
    "input_data_format": None,
    "max_patches": 12,
    "min_patches": 1,
    "processor_class": "InternVLProcessor",
    "resample": 3,
    "rescale_factor": 1 / 255,
    "return_tensors": None,
    "size": {"height": 448, "width": 448},
}
TILE = 448
PATCH = 14
DOWNSAMPLE_RATIO = 0.5
IMAGE_SEQ_LENGTH = int((TILE // PATCH) ** 2 * DOWNSAMPLE_RATIO**2)  # 256 tokens per tile

_TEXT: dict[str, Any] = {
    "model_type": "qwen2",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,  # head_dim 32
    "num_key_value_heads": 2,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0},
    "tie_word_embeddings": True,
    # Also the projector's init. Greedy answers to image chats (prompts of thousands of image
    # tokens) repeat one token at 0.15 (fallback_models' value) and below; at 0.3 they are
    # varied text that changes with the images.
    "initializer_range": 0.3,
}
_VISION: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,  # head_dim 32
    "image_size": [TILE, TILE],
    "patch_size": [PATCH, PATCH],
    "hidden_act": "gelu",
    "norm_type": "layer_norm",
    "layer_norm_eps": 1e-6,
    "use_qk_norm": False,
    "attention_bias": True,
    "use_mean_pooling": True,
    "use_absolute_position_embeddings": True,
    "layer_scale_init_value": 0.1,
    "initializer_range": 0.15,
}


def build_model(out_dir: Path, weights: bool = True, crop_to_patches: bool = False) -> Path:
    """Write the tiny InternVL model into `out_dir`: config, tokenizer, processor files and,
    with `weights`, seeded random weights (without them: enough for the processors).

    `crop_to_patches` is the image processor's own setting (false as released): it decides
    only what the image processor does called alone, as benchmarks call it; InternVLProcessor
    and vLLM tile either way."""
    from transformers import (
        GotOcr2ImageProcessor,
        InternVLConfig,
        InternVLProcessor,
        InternVLVideoProcessor,
    )

    from engine_server.tiny_models import fast_tokenizer, save_processor, token_ids

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = fast_tokenizer(
        SPECIAL_TOKENS,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        extra_special_tokens=EXTRA_SPECIAL_TOKENS,
        chat_template=CHAT_TEMPLATE,
        model_max_length=_TEXT["max_position_embeddings"],
    )
    ids = token_ids(tokenizer, (ENDOFTEXT, IM_END, IMG_CONTEXT))
    text = {
        **_TEXT,
        "vocab_size": len(tokenizer),
        "bos_token_id": ids[ENDOFTEXT],
        "eos_token_id": ids[IM_END],
        "pad_token_id": ids[ENDOFTEXT],
    }
    config = InternVLConfig(
        text_config=text,
        vision_config=dict(_VISION),
        image_token_id=ids[IMG_CONTEXT],
        image_seq_length=IMAGE_SEQ_LENGTH,
        downsample_ratio=DOWNSAMPLE_RATIO,
        projector_hidden_act="gelu",
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
        tie_word_embeddings=True,
        dtype="float32",
    )
    config.architectures = [ARCHITECTURE]
    if weights:
        _save_weights(config, ids, out_dir)
    else:
        config.save_pretrained(out_dir)

    preprocessor = {**PREPROCESSOR, "crop_to_patches": crop_to_patches}
    settings = {k: v for k, v in preprocessor.items() if k not in _NOT_KWARGS}
    processor = InternVLProcessor(
        image_processor=GotOcr2ImageProcessor(**settings),
        video_processor=InternVLVideoProcessor(size=PREPROCESSOR["size"]),
        tokenizer=tokenizer,
        image_seq_length=IMAGE_SEQ_LENGTH,
        chat_template=CHAT_TEMPLATE,
    )
    save_processor(processor, tokenizer, out_dir, CHAT_TEMPLATE, preprocessor)
    _released_tokenizer_layout(out_dir / "tokenizer_config.json")
    return out_dir


# Keys of the released file that are not image-processor settings.
_NOT_KWARGS = ("image_processor_type", "processor_class", "return_tensors", "device")


def _save_weights(config: Any, ids: dict[str, int], out_dir: Path) -> None:
    from transformers import InternVLForConditionalGeneration

    from engine_server.tiny_models import save_model, seeded_model

    model = seeded_model(lambda: InternVLForConditionalGeneration(config))
    save_model(
        model,
        out_dir,
        bos_token_id=ids[ENDOFTEXT],
        eos_token_id=ids[IM_END],
        pad_token_id=ids[ENDOFTEXT],
    )
    _released_weight_names(out_dir / "model.safetensors")


# transformers 5.19 saves this model's weights under the names of its own module tree;
# released checkpoints (converted with transformers 4.5x) have these, which vLLM's
# InternS1ForConditionalGeneration.hf_to_vllm_mapper maps.
_RELEASED_PREFIXES = {
    "language_model.model.": "model.language_model.",
    "language_model.lm_head.": "lm_head.",
    "vision_tower.": "model.vision_tower.",
    "multi_modal_projector.": "model.multi_modal_projector.",
}


def _released_weight_names(path: Path) -> None:
    from safetensors.torch import load_file, save_file

    def released(name: str) -> str:
        for old, new in _RELEASED_PREFIXES.items():
            if name.startswith(old):
                return new + name[len(old) :]
        return name

    weights = {released(k): v for k, v in load_file(path).items()}
    save_file(weights, path, metadata={"format": "pt"})


def _released_tokenizer_layout(path: Path) -> None:
    # transformers 5 writes the named tokens as top-level keys; released checkpoints (and
    # transformers 4.x readers) have them under "extra_special_tokens".
    config = json.loads(path.read_text())
    for key in EXTRA_SPECIAL_TOKENS:
        config.pop(key, None)
    config["extra_special_tokens"] = dict(EXTRA_SPECIAL_TOKENS)
    path.write_text(json.dumps(config, indent=2))
