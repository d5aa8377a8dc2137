"""A tiny Qwen2.5-Omni model directory, written at test time; vLLM serves its thinker.

vLLM 0.32 maps the released architecture name `Qwen2_5OmniModel` (and
`Qwen2_5OmniForConditionalGeneration`) to its Qwen2_5OmniThinkerForConditionalGeneration, which
reads `thinker_config` from a `qwen2_5_omni` config and loads only the `thinker.*` weights
(`talker.*` and `token2wav.*` are skipped). So the directory holds a full Qwen2_5OmniConfig (the
talker and token2wav configs at transformers' defaults, enable_audio_output false) and the
weights of a tiny thinker alone, saved under the released `thinker.` prefix.

The thinker: Qwen2.5-Omni's audio encoder (128 mel bins, windows of 2 * n_window frames, the
same ((L-1)//2+1-2)//2+1 tokens for L mel frames as Qwen2-Audio), a Qwen2.5-VL-like vision
tower and a Qwen2 decoder with M-RoPE. The BPE and decoder dims are the tiny Qwen ones with
Omni's special tokens (named as released: <|AUDIO|>, <|audio_bos|>, <|vision_bos|>, <|IMAGE|>,
...); the template is the released one (transformers' Qwen2.5-Omni processor tests ship it),
and the feature extractor the released one: chunk_length 300, so vLLM pads to 300 s and does
not cut a clip at 30 s as it does for Qwen2-Audio.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine_server import tiny_models as tm

AUDIO = "<|AUDIO|>"
AUDIO_BOS = "<|audio_bos|>"
AUDIO_EOS = "<|audio_eos|>"
VISION_BOS = "<|vision_bos|>"
VISION_EOS = "<|vision_eos|>"
IMAGE = "<|IMAGE|>"
VIDEO = "<|VIDEO|>"
SPECIAL_TOKENS = (
    tm.ENDOFTEXT,
    tm.IM_START,
    tm.IM_END,
    AUDIO,
    AUDIO_BOS,
    AUDIO_EOS,
    VISION_BOS,
    VISION_EOS,
    IMAGE,
    VIDEO,
)
# Qwen2_5OmniProcessor reads these names off its tokenizer.
NAMED_TOKENS = {
    "audio_token": AUDIO,
    "audio_bos_token": AUDIO_BOS,
    "audio_eos_token": AUDIO_EOS,
    "image_token": IMAGE,
    "video_token": VIDEO,
    "vision_bos_token": VISION_BOS,
    "vision_eos_token": VISION_EOS,
}

# The released chat template of Qwen/Qwen2.5-Omni-7B (audio parts without "Audio N: " unless
# add_audio_id is set).
CHAT_TEMPLATE = (
    "{% set audio_count = namespace(value=0) %}{% set image_count = namespace(value=0) %}"
    "{% set video_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n"
    "You are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_bos|><|IMAGE|><|vision_eos|>"
    "{% elif content['type'] == 'audio' or 'audio' in content or 'audio_url' in content %}"
    "{% set audio_count.value = audio_count.value + 1 %}"
    "{% if add_audio_id %}Audio {{ audio_count.value }}: {% endif %}"
    "<|audio_bos|><|AUDIO|><|audio_eos|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_bos|><|VIDEO|><|vision_eos|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# The audio half of the released preprocessor_config.json of Qwen/Qwen2.5-Omni-7B.
FEATURE_EXTRACTOR: dict[str, Any] = {
    "chunk_length": 300,
    "dither": 0.0,
    "feature_extractor_type": "WhisperFeatureExtractor",
    "feature_size": 128,
    "hop_length": 160,
    "n_fft": 400,
    "n_samples": 4800000,
    "nb_max_frames": 30000,
    "padding_side": "right",
    "padding_value": 0.0,
    "return_attention_mask": True,
    "sampling_rate": 16000,
}
# The image half, with the tiny Qwen pixel caps (64 merged patches at most).
IMAGE_PROCESSOR: dict[str, Any] = {
    "image_processor_type": "Qwen2VLImageProcessor",
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "min_pixels": tm.MIN_PIXELS,
    "max_pixels": tm.MAX_PIXELS,
    "merge_size": 2,
    "patch_size": 14,
    "temporal_patch_size": 2,
}

# The audio tower is transformers' Qwen2_5OmniAudioEncoder inside vLLM: no CPU attention
# kernel constrains its head dim. output_dim is the decoder's hidden size.
AUDIO_CONFIG: dict[str, Any] = {
    "num_mel_bins": 128,
    "encoder_layers": 2,
    "encoder_attention_heads": 2,
    "encoder_ffn_dim": 128,
    "d_model": 64,
    "max_source_positions": 1500,
    "n_window": 100,
    "output_dim": tm.TEXT_DIMS["hidden_size"],
    "initializer_range": 0.5,
}
# vLLM's own Qwen2.5-VL vision tower: head_dim 32, as for the tiny Qwen2.5-VL.
VISION_CONFIG: dict[str, Any] = {
    "depth": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_heads": 2,
    "out_hidden_size": tm.TEXT_DIMS["hidden_size"],
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "window_size": 56,
    "fullatt_block_indexes": [1],
}


def tokenizer() -> Any:
    """The tiny Qwen BPE with Omni's special tokens, named for Qwen2_5OmniProcessor."""
    return tm.fast_tokenizer(
        SPECIAL_TOKENS,
        eos_token=tm.IM_END,
        pad_token=tm.ENDOFTEXT,
        extra_special_tokens=NAMED_TOKENS,
        chat_template=CHAT_TEMPLATE,
        model_max_length=tm.TEXT_DIMS["max_position_embeddings"],
    )


def _thinker_config(tok: Any) -> dict[str, Any]:
    ids = tm.token_ids(tok, SPECIAL_TOKENS)
    text = tm.text_config_kwargs(tok)
    rope_theta = text.pop("rope_theta")
    # M-RoPE splits the head_dim/2 = 16 rotary pairs across (t, h, w).
    text["rope_parameters"] = {
        "rope_type": "default",
        "rope_theta": rope_theta,
        "mrope_section": [4, 6, 6],
    }
    text["tie_word_embeddings"] = True
    return {
        "audio_config": AUDIO_CONFIG,
        "vision_config": VISION_CONFIG,
        "text_config": text,
        "audio_token_index": ids[AUDIO],
        "image_token_index": ids[IMAGE],
        "video_token_index": ids[VIDEO],
        "audio_start_token_id": ids[AUDIO_BOS],
        "audio_end_token_id": ids[AUDIO_EOS],
        "vision_start_token_id": ids[VISION_BOS],
        "vision_end_token_id": ids[VISION_EOS],
        "tie_word_embeddings": True,
    }


def build_model(out_dir: Path) -> Path:
    """A Qwen2.5-Omni dir (thinker weights only, float32), its tokenizer, template and
    processor."""
    from transformers import (
        Qwen2_5OmniConfig,
        Qwen2_5OmniProcessor,
        Qwen2_5OmniThinkerConfig,
        Qwen2_5OmniThinkerForConditionalGeneration,
        Qwen2VLImageProcessor,
        Qwen2VLVideoProcessor,
        WhisperFeatureExtractor,
    )

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = tokenizer()
    thinker_config = Qwen2_5OmniThinkerConfig(**_thinker_config(tok), dtype="float32")
    thinker = tm.seeded_model(lambda: Qwen2_5OmniThinkerForConditionalGeneration(thinker_config))
    ids = tm.token_ids(tok, (tm.ENDOFTEXT, tm.IM_END))
    _save_thinker(thinker, out_dir)
    config = Qwen2_5OmniConfig(
        thinker_config=thinker_config,
        enable_audio_output=False,
        dtype="float32",
    )
    config.architectures = ["Qwen2_5OmniModel"]  # the released name
    config.save_pretrained(out_dir)
    tm.write_json(
        out_dir / "generation_config.json",
        {
            "bos_token_id": ids[tm.ENDOFTEXT],
            "eos_token_id": [ids[tm.IM_END], ids[tm.ENDOFTEXT]],
            "pad_token_id": ids[tm.ENDOFTEXT],
        },
    )
    tm.save_tokenizer(tok, out_dir, CHAT_TEMPLATE)

    size = {"shortest_edge": tm.MIN_PIXELS, "longest_edge": tm.MAX_PIXELS}
    processor = Qwen2_5OmniProcessor(
        image_processor=Qwen2VLImageProcessor(
            size=size,
            image_mean=IMAGE_PROCESSOR["image_mean"],
            image_std=IMAGE_PROCESSOR["image_std"],
        ),
        video_processor=Qwen2VLVideoProcessor(size=size),
        feature_extractor=WhisperFeatureExtractor(**FEATURE_EXTRACTOR),
        tokenizer=tok,
        chat_template=CHAT_TEMPLATE,
    )
    preprocessor = {
        **FEATURE_EXTRACTOR,
        **IMAGE_PROCESSOR,
        "processor_class": "Qwen2_5OmniProcessor",
    }
    tm.save_processor(processor, tok, out_dir, CHAT_TEMPLATE, preprocessor=preprocessor)
    return out_dir


def _save_thinker(thinker: Any, out_dir: Path) -> None:
    # Released checkpoints keep the thinker's weights under "thinker." (vLLM maps
    # thinker.model.* to its language model and drops talker.* and token2wav.*). The tied
    # lm_head is left out, as save_pretrained leaves it out.
    from safetensors.torch import save_file

    weights = {
        "thinker." + name: tensor.detach().contiguous()
        for name, tensor in thinker.state_dict().items()
        if name != "lm_head.weight"
    }
    save_file(weights, out_dir / "model.safetensors", metadata={"format": "pt"})
