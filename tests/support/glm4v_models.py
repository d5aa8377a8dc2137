"""Tiny random-weight GLM-4.1V / 4.5V / 4.6V model directories, written at test time.

Three variants, as the released checkpoints come:
- `glm4v` (GLM-4.1V-9B-Thinking, GLM-4.6V-Flash): Glm4vForConditionalGeneration, a GLM-4
  dense decoder under the GLM vision tower, with `Glm4vProcessor`;
- `glm4v_moe` (GLM-4.5V, GLM-4.6V): Glm4vMoeForConditionalGeneration, a GLM-4.5 MoE decoder
  (a dense first layer, then 4 routed experts and a shared one), with `Glm46VProcessor` as
  GLM-4.6V ships it;
- `glm46v` (transformers' own GLM-4.6V config class): vLLM 0.32 has no model class for the
  architecture (`Glm46VForConditionalGeneration`), so this one is written without weights and
  names `Glm4vForConditionalGeneration`, whose processing code vLLM runs for it; the
  processor parity tests use it.

What is as released: the chat template (GLM-4.1V-9B-Thinking's, verbatim: each image is
`<|begin_of_image|><|image|><|end_of_image|>`, `<|image|>` being what vLLM expands), the
special tokens (added tokens of our locally trained BPE), the flat `preprocessor_config.json`
(patch 14, merge 2, temporal patch 2, OpenAI CLIP mean/std, 112x112 to 9,633,792 pixels),
the vision tower's geometry (patch 14, merge 2, 336px position grid). What is shrunk: both
towers (2 layers, head dim 32), and with `tiny` the pixel cap (64 merged patches an image) so
the end-to-end prompts stay short.

Random weights make greedy text depend on the image only with wide text weights (the
`initializer_range` below: at transformers' 0.02 every image gives the same text).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

VARIANTS = ("glm4v", "glm4v_moe", "glm46v")
ARCHITECTURES = {
    "glm4v": "Glm4vForConditionalGeneration",
    "glm4v_moe": "Glm4vMoeForConditionalGeneration",
    "glm46v": "Glm4vForConditionalGeneration",
}
ENDOFTEXT = "<|endoftext|>"
USER, ASSISTANT, OBSERVATION = "<|user|>", "<|assistant|>", "<|observation|>"
BEGIN_OF_IMAGE, END_OF_IMAGE, IMAGE = "<|begin_of_image|>", "<|end_of_image|>", "<|image|>"
BEGIN_OF_VIDEO, END_OF_VIDEO, VIDEO = "<|begin_of_video|>", "<|end_of_video|>", "<|video|>"
# In the released vocabulary's order (151329 on); ids here follow our BPE, appended after it.
SPECIAL_TOKENS = (
    ENDOFTEXT,
    "[MASK]",
    "[gMASK]",
    "[sMASK]",
    "<sop>",
    "<eop>",
    "<|system|>",
    USER,
    ASSISTANT,
    OBSERVATION,
    BEGIN_OF_IMAGE,
    END_OF_IMAGE,
    BEGIN_OF_VIDEO,
    END_OF_VIDEO,
    IMAGE,
    VIDEO,
    "<think>",
    "</think>",
)

# zai-org/GLM-4.1V-9B-Thinking's chat_template.jinja, verbatim.
CHAT_TEMPLATE = """[gMASK]<sop>
{%- for msg in messages %}
    {%- if msg.role == 'system' %}
<|system|>
{{ msg.content }}
    {%- elif msg.role == 'user' %}
<|user|>{{ '\\n' }}

        {%- if msg.content is string %}
{{ msg.content }}
        {%- else %}
            {%- for item in msg.content %}
                {%- if item.type == 'video' or 'video' in item %}
<|begin_of_video|><|video|><|end_of_video|>
                {%- elif item.type == 'image' or 'image' in item %}
<|begin_of_image|><|image|><|end_of_image|>
                {%- elif item.type == 'text' %}
{{ item.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
    {%- elif msg.role == 'assistant' %}
        {%- if msg.metadata %}
<|assistant|>{{ msg.metadata }}
{{ msg.content }}
        {%- else %}
<|assistant|>
{{ msg.content }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{% if add_generation_prompt %}<|assistant|>
{% endif %}"""

# The released preprocessor_config.json (GLM-4.1V-9B-Thinking; GLM-4.6V names the Glm46V
# classes, same values).
PREPROCESSOR: dict[str, Any] = {
    "size": {"shortest_edge": 12544, "longest_edge": 9633792},
    "do_rescale": True,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "image_processor_type": "Glm4vImageProcessor",
    "processor_class": "Glm4vProcessor",
}
# The released video_preprocessor_config.json of GLM-4.1V-9B-Thinking and GLM-4.5V (what
# vLLM picks its `opencv_dynamic` loader by): Glm4vVideoProcessor with the image's patch
# geometry and mean/std, and its own pixel bounds over all frames.
VIDEO_PREPROCESSOR: dict[str, Any] = {
    "size": {"shortest_edge": 12544, "longest_edge": 47040000},
    "do_rescale": True,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "video_processor_type": "Glm4vVideoProcessor",
    "processor_class": "Glm4vProcessor",
}
# With `tiny`: at most 64 merged patches over all frames (the bound holds for t x h x w).
TINY_VIDEO_PIXELS = {"shortest_edge": 12544, "longest_edge": 2 * 28 * 28 * 64}
PROCESSOR_CLASSES = {
    "glm4v": ("Glm4vImageProcessor", "Glm4vProcessor"),
    "glm4v_moe": ("Glm46VImageProcessor", "Glm46VProcessor"),
    "glm46v": ("Glm46VImageProcessor", "Glm46VProcessor"),
}
# At most 64 merged patches an image (smart_resize bounds 2 x h x w: the temporal copy).
TINY_PIXELS = {"shortest_edge": 12544, "longest_edge": 2 * 28 * 28 * 64}

_TEXT: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,  # head_dim 32 (vLLM's CPU attention)
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    # as released: half the head rotary, its pairs split over (t, h, w) as 8/12/12 of 32
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.5,
        "mrope_section": [2, 3, 3],
    },
    "rms_norm_eps": 1e-5,
    "initializer_range": 0.15,
}
_MOE: dict[str, Any] = {
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "moe_intermediate_size": 64,
    "first_k_dense_replace": 1,
    "n_group": 1,
    "topk_group": 1,
    "attention_bias": True,
    "head_dim": 32,
    "use_qk_norm": False,  # as released; vLLM's Glm4MoeForCausalLM reads it
}
_VISION: dict[str, Any] = {
    "depth": 2,
    "hidden_size": 64,
    "num_heads": 2,  # head_dim 32
    "intermediate_size": 256,  # the merger's inner width
    "out_hidden_size": 128,  # = the text hidden size
    "image_size": 336,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "initializer_range": 0.15,
}


def build_model(
    out_dir: Path, variant: str = "glm4v", weights: bool = True, tiny: bool = True
) -> Path:
    """Write a tiny model of `variant` (one of VARIANTS) into `out_dir`; `tiny` caps images at
    64 merged patches (else the released limits). The `glm46v` variant has no weights."""
    if variant not in VARIANTS:
        raise ValueError(f"variant {variant!r} is not one of {VARIANTS}")
    from engine_server.tiny_models import save_processor, token_ids, write_json

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer()
    ids = token_ids(tokenizer, SPECIAL_TOKENS)
    config = _config(variant, tokenizer, ids)
    if weights and variant != "glm46v":
        _save_weights(config, variant, ids, out_dir)
    else:
        config.save_pretrained(out_dir)
    image_class, processor_class = PROCESSOR_CLASSES[variant]
    size = TINY_PIXELS if tiny else PREPROCESSOR["size"]
    pre = {
        **PREPROCESSOR,
        "size": size,
        "image_processor_type": image_class,
        "processor_class": processor_class,
    }
    # GLM-4.6V's own video processor (Glm46VVideoProcessor) keeps its class defaults here.
    video = None
    if processor_class == "Glm4vProcessor":
        video = {
            **VIDEO_PREPROCESSOR,
            "size": TINY_VIDEO_PIXELS if tiny else VIDEO_PREPROCESSOR["size"],
        }
    processor = _processor(processor_class, pre, tokenizer, video)
    save_processor(processor, tokenizer, out_dir, CHAT_TEMPLATE, pre)
    if video is not None:
        write_json(out_dir / "video_preprocessor_config.json", video)
    return out_dir


def _tokenizer() -> Any:
    from engine_server.tiny_models import fast_tokenizer

    return fast_tokenizer(
        SPECIAL_TOKENS,
        eos_token=ENDOFTEXT,
        pad_token=ENDOFTEXT,
        chat_template=CHAT_TEMPLATE,
        model_max_length=_TEXT["max_position_embeddings"],
    )


def _config(variant: str, tokenizer: Any, ids: dict[str, int]) -> Any:
    import transformers

    text = {
        **_TEXT,
        **(_MOE if variant == "glm4v_moe" else {}),
        "vocab_size": len(tokenizer),
        "pad_token_id": ids[ENDOFTEXT],
        "eos_token_id": ids[ENDOFTEXT],
    }
    cls = {"glm4v": "Glm4vConfig", "glm4v_moe": "Glm4vMoeConfig", "glm46v": "Glm46VConfig"}
    config = getattr(transformers, cls[variant])(
        text_config=text,
        vision_config=dict(_VISION),
        image_token_id=ids[IMAGE],
        video_token_id=ids[VIDEO],
        image_start_token_id=ids[BEGIN_OF_IMAGE],
        image_end_token_id=ids[END_OF_IMAGE],
        video_start_token_id=ids[BEGIN_OF_VIDEO],
        video_end_token_id=ids[END_OF_VIDEO],
        tie_word_embeddings=False,
    )
    config.architectures = [ARCHITECTURES[variant]]
    config.dtype = "float32"
    return config


def _processor(
    processor_class: str, pre: dict[str, Any], tokenizer: Any, video_pre: dict[str, Any] | None
) -> Any:
    import transformers

    prefix = processor_class.removesuffix("Processor")
    names = ("image_processor_type", "video_processor_type", "processor_class")
    settings = {k: v for k, v in pre.items() if k not in names}
    image = getattr(transformers, f"{prefix}ImageProcessor")(**settings)
    video_settings = {k: v for k, v in (video_pre or {}).items() if k not in names}
    video = getattr(transformers, f"{prefix}VideoProcessor")(**video_settings)
    return getattr(transformers, processor_class)(
        image_processor=image,
        video_processor=video,
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
    )


def _save_weights(config: Any, variant: str, ids: dict[str, int], out_dir: Path) -> None:
    import transformers

    from engine_server.tiny_models import save_model, seeded_model

    cls = getattr(transformers, ARCHITECTURES[variant])
    model = seeded_model(lambda: cls(config))
    # As released, a turn ends at <|endoftext|>, <|user|> or <|observation|>.
    eos = [ids[ENDOFTEXT], ids[USER], ids[OBSERVATION]]
    save_model(model, out_dir, eos_token_id=eos, pad_token_id=ids[ENDOFTEXT])
