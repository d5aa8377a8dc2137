"""Tiny LLaVA-1.5 and LLaVA-NeXT model directories (configs, tokenizer, processor configs; no
weights), written at test time, for the processors' parity tests and benchmarks."""

from __future__ import annotations

IMAGE = "<image>"
# LLaVA-1.5's "USER: <image>\n... ASSISTANT:" prompt format.
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}USER: "
    "{% for c in message['content'] %}{% if c['type'] == 'image' %}<image>\n"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %} "
    "{% else %}ASSISTANT: {{ message['content'] }}</s>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)
# llava-v1.6's pinpoints, plus a model with an unusual set (odd multiples, 3x3) for the counts.
NEXT_PINPOINTS = [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]
ODD_PINPOINTS = [[336, 336], [336, 1344], [1008, 672], [1008, 1008], [672, 1680], [2016, 336]]


def build_model(out_dir, kind: str, pinpoints=NEXT_PINPOINTS):
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlavaConfig,
        LlavaImageProcessor,
        LlavaNextConfig,
        LlavaNextImageProcessor,
        LlavaNextProcessor,
        LlavaProcessor,
        Qwen2Config,
    )

    from engine_server.tiny_models import fast_tokenizer

    tokenizer = fast_tokenizer(
        ("<s>", "</s>", "<pad>", IMAGE),
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        chat_template=CHAT_TEMPLATE,
    )
    image_token = tokenizer.convert_tokens_to_ids(IMAGE)
    vision = CLIPVisionConfig(
        image_size=336,
        patch_size=14,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        projection_dim=32,
    )
    text = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    common = {
        "vision_config": vision,
        "text_config": text,
        "image_token_index": image_token,
        "vision_feature_select_strategy": "default",
        "vision_feature_layer": -2,
    }
    # As in llava-hf's processor configs: patch 14, CLS counted, dropped by "default".
    processor_kwargs = {
        "tokenizer": tokenizer,
        "patch_size": 14,
        "vision_feature_select_strategy": "default",
        "num_additional_image_tokens": 1,
        "chat_template": CHAT_TEMPLATE,
    }
    crop = {"height": 336, "width": 336}
    if kind in ("llava", "llava_pad"):
        config = LlavaConfig(**common)
        # LlavaImageProcessor's do_pad first pads to a square with the mean colour.
        pixels = (
            CLIPImageProcessor(size={"shortest_edge": 336}, crop_size=crop)
            if kind == "llava"
            else LlavaImageProcessor(size={"shortest_edge": 336}, crop_size=crop, do_pad=True)
        )
        processor = LlavaProcessor(image_processor=pixels, **processor_kwargs)
    else:
        config = LlavaNextConfig(**common, image_grid_pinpoints=pinpoints)
        processor = LlavaNextProcessor(
            image_processor=LlavaNextImageProcessor(
                size={"shortest_edge": 336}, crop_size=crop, image_grid_pinpoints=pinpoints
            ),
            **processor_kwargs,
        )
    config.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)
    return out_dir
