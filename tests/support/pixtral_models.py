"""Tiny Mistral 3 (`mistral3` / Mistral3ForConditionalGeneration) and HF-format Pixtral (`llava`
with a `pixtral` tower) model directories, both read by transformers' PixtralProcessor.

Built at test time (no hub access): a two-layer Mistral decoder under a two-layer Pixtral vision
tower and Mistral 3's patch-merging projector, seeded random weights, our locally trained BPE
with the Tekken vocabulary's special tokens (in its order, appended after the BPE), the released
chat template, and the released image-processor settings unchanged: Mistral Small 3.1's
(`size.longest_edge` 1540, 14px patches merged 2x2: one token per 28px square) and
Pixtral-12B's (1024, 16px patches, no merge). No size is shrunk: images of the end-to-end cases
stay far below the longest edge (at most 18 x 24 tokens for 640x480), and vLLM's profiling of
a 1540px image takes seconds with these widths. Only the widths shrink: head dim 32 in both
towers (vLLM's CPU attention), a few MB in all.

`weights=False` writes everything but the weights (the processors' parity tests need no more);
`kind="pixtral"` writes the weightless Pixtral-HF directory instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

MODEL_TYPE = "mistral3"
ARCHITECTURE = "Mistral3ForConditionalGeneration"
KINDS = ("mistral3", "pixtral")

UNK, BOS, EOS, PAD = "<unk>", "<s>", "</s>", "<pad>"
IMAGE = "[IMG]"  # what the chat templates write per image; its embeddings' token too
IMAGE_BREAK = "[IMG_BREAK]"
IMAGE_END = "[IMG_END]"
# The first ids of the Tekken vocabulary, in its order (ours follow our BPE, after it).
SPECIAL_TOKENS = (
    UNK,
    BOS,
    EOS,
    "[INST]",
    "[/INST]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "[TOOL_CALLS]",
    IMAGE,
    PAD,
    IMAGE_BREAK,
    IMAGE_END,
    "[PREFIX]",
    "[MIDDLE]",
    "[SUFFIX]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[TOOL_CONTENT]",
)

# mistralai/Mistral-Small-3.1-24B-Instruct-2503's chat template (chat_template.json): a default
# system prompt with today's date, then [INST]...[/INST] turns, one [IMG] per image part.
MISTRAL3_CHAT_TEMPLATE = (
    '{%- set today = strftime_now("%Y-%m-%d") %}\n'
    '{%- set default_system_message = "You are Mistral Small 3, a Large Language Model (LLM) '
    "created by Mistral AI, a French startup headquartered in Paris.\\nYour knowledge base was "
    'last updated on 2023-10-01. The current date is " + today + ".\\n\\nWhen you\'re not sure '
    "about some information, you say that you don't have the information and don't make up "
    "anything.\\nIf the user's question is not clear, ambiguous, or does not provide enough "
    "context for you to accurately answer the question, you do not try to answer it right away "
    'and you rather ask the user to clarify their request (e.g. \\"What are some good restaurants '
    'around me?\\" ⇒ \\"Where are you?\\" or \\"When is the next flight to Tokyo\\" ⇒ \\"Where '
    'do you travel from?\\")" %}\n'
    "\n"
    "{{- bos_token }}\n"
    "\n"
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {%- if messages[0]['content'] is string %}\n"
    "        {%- set system_message = messages[0]['content'] %}\n"
    "    {%- else %}\n"
    "        {%- set system_message = messages[0]['content'][0]['text'] %}\n"
    "    {%- endif %}\n"
    "    {%- set loop_messages = messages[1:] %}\n"
    "{%- else %}\n"
    "    {%- set system_message = default_system_message %}\n"
    "    {%- set loop_messages = messages %}\n"
    "{%- endif %}\n"
    "{{- '[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}\n"
    "\n"
    "{%- for message in loop_messages %}\n"
    "    {%- if message['role'] == 'user' %}\n"
    "        {%- if message['content'] is string %}\n"
    "            {{- '[INST]' + message['content'] + '[/INST]' }}\n"
    "        {%- else %}\n"
    "            {{- '[INST]' }}\n"
    "            {%- for block in message['content'] %}\n"
    "                {%- if block['type'] == 'text' %}\n"
    "                    {{- block['text'] }}\n"
    "                {%- elif block['type'] in ['image', 'image_url'] %}\n"
    "                    {{- '[IMG]' }}\n"
    "                {%- else %}\n"
    "                    {{- raise_exception('Only text and image blocks are supported in "
    "message content!') }}\n"
    "                {%- endif %}\n"
    "            {%- endfor %}\n"
    "            {{- '[/INST]' }}\n"
    "        {%- endif %}\n"
    "    {%- elif message['role'] == 'system' %}\n"
    "        {{- '[SYSTEM_PROMPT]' + (message['content'] if message['content'] is string else "
    "message['content'][0]['text']) + '[/SYSTEM_PROMPT]' }}\n"
    "    {%- elif message['role'] == 'assistant' %}\n"
    "        {{- (message['content'] if message['content'] is string else "
    "message['content'][0]['text']) + eos_token }}\n"
    "    {%- else %}\n"
    "        {{- raise_exception('Only user, system and assistant roles are supported!') }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}"
)

# mistral-community/pixtral-12b's chat template: the system message goes into the last user
# turn, text parts may carry "content" or "text".
PIXTRAL_CHAT_TEMPLATE = (
    '{%- if messages[0]["role"] == "system" %}{%- set system_message = messages[0]["content"] %}'
    "{%- set loop_messages = messages[1:] %}\n"
    "{%- else %}{%- set loop_messages = messages %}{%- endif %}{{- bos_token }}"
    "{%- for message in loop_messages %}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{- raise_exception('After "
    "the optional system message, conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{%- endif %}"
    '{%- if message["role"] == "user" %}{%- if loop.last and system_message is defined %}'
    '{{- "[INST]" + system_message + "\\n\\n" }}{%- else %}{{ "[INST]" }}{%- endif %}'
    "{%- endif %}"
    '{%- if message["content"] is not string %}{%- for chunk in message["content"] %}'
    '{%- if chunk["type"] == "text" %}{%- if "content" in chunk %}{{- chunk["content"] }}'
    '{%- elif "text" in chunk %}{{- chunk["text"] }}{%- endif %}'
    '{%- elif chunk["type"] == "image" %}{{- "[IMG]" }}'
    '{%- else %}{{- raise_exception("Unrecognized content type!") }}{%- endif %}{%- endfor %}'
    '{%- else %}{{- message["content"] }}{%- endif %}'
    '{%- if message["role"] == "user" %}{{- "[/INST]" }}'
    '{%- elif message["role"] == "assistant" %}{{- eos_token}}'
    '{%- else %}{{- raise_exception("Only user and assistant roles are supported, with the '
    'exception of an initial optional system message!") }}{%- endif %}{%- endfor %}'
)

_CLIP = {
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
}
# Mistral-Small-3.1-24B-Instruct-2503's preprocessor_config.json. The image processor's own
# patch_size is not what resizes: PixtralProcessor passes patch_size x spatial_merge_size.
MISTRAL3_PREPROCESSOR: dict[str, Any] = {
    "crop_size": None,
    "data_format": "channels_first",
    "default_to_square": True,
    "device": None,
    "do_center_crop": None,
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    **_CLIP,
    "image_processor_type": "PixtralImageProcessor",
    "input_data_format": None,
    "patch_size": {"height": 14, "width": 14},
    "processor_class": "PixtralProcessor",
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "return_tensors": None,
    "size": {"longest_edge": 1540},
}
# mistral-community/pixtral-12b's preprocessor_config.json.
PIXTRAL_PREPROCESSOR: dict[str, Any] = {
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    **_CLIP,
    "image_processor_type": "PixtralImageProcessor",
    "patch_size": {"height": 16, "width": 16},
    "processor_class": "PixtralProcessor",
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "size": {"longest_edge": 1024},
}
# Each kind's processor_config.json settings (what the processor, not the image processor,
# reads): the pixels of one token are patch_size x spatial_merge_size.
PROCESSOR = {"mistral3": {"patch_size": 14, "spatial_merge_size": 2}, "pixtral": {"patch_size": 16}}

# head_dim 32 (vLLM's CPU attention needs 32/64/80/...).
_TEXT: dict[str, Any] = {
    "model_type": "mistral",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000_000.0},
    "sliding_window": None,
    # Also the projector's init.
    "initializer_range": 0.15,
}
# Released tower geometry (image_size = the longest edge, so the 2D RoPE table covers every
# patch), tiny widths.
_VISION: dict[str, dict[str, Any]] = {
    "mistral3": {"image_size": 1540, "patch_size": 14, "hidden_act": "silu"},
    "pixtral": {"image_size": 1024, "patch_size": 16, "hidden_act": "gelu"},
}
_VISION_DIMS: dict[str, Any] = {
    "model_type": "pixtral",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "head_dim": 32,
    "num_channels": 3,
    "rope_theta": 10000.0,
    "initializer_range": 0.15,
}


def build_model(out_dir: Path, weights: bool = True, kind: str = "mistral3") -> Path:
    """Write a tiny model of `kind` (configs, tokenizer, processor, and weights if `weights`;
    the Pixtral-HF kind has none)."""
    from transformers import PixtralImageProcessor, PixtralProcessor

    from engine_server.tiny_models import fast_tokenizer, save_processor, token_ids

    if kind not in KINDS:
        raise ValueError(f"kind {kind!r} is not one of {KINDS}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    template = MISTRAL3_CHAT_TEMPLATE if kind == "mistral3" else PIXTRAL_CHAT_TEMPLATE
    tokenizer = fast_tokenizer(
        SPECIAL_TOKENS,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        pad_token=PAD,
        chat_template=template,
        model_max_length=_TEXT["max_position_embeddings"],
    )
    ids = token_ids(tokenizer, (BOS, EOS, PAD, IMAGE))
    config = _config(kind, len(tokenizer), ids)
    if weights and kind == "mistral3":
        _save_weights(config, out_dir, ids)
    else:
        config.save_pretrained(out_dir)

    preprocessor = MISTRAL3_PREPROCESSOR if kind == "mistral3" else PIXTRAL_PREPROCESSOR
    image_processor = PixtralImageProcessor(
        **{k: v for k, v in preprocessor.items() if k not in _NOT_KWARGS}
    )
    processor = PixtralProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        chat_template=template,
        **PROCESSOR[kind],
    )
    save_processor(processor, tokenizer, out_dir, template, preprocessor)
    return out_dir


# Keys of the released files that are not image-processor settings.
_NOT_KWARGS = ("image_processor_type", "processor_class")


def _config(kind: str, vocab_size: int, ids: dict[str, int]) -> Any:
    from transformers import LlavaConfig, Mistral3Config

    text = {
        **_TEXT,
        "vocab_size": vocab_size,
        "bos_token_id": ids[BOS],
        "eos_token_id": ids[EOS],
        "pad_token_id": ids[PAD],
        "tie_word_embeddings": False,
    }
    vision = {**_VISION_DIMS, **_VISION[kind]}
    if kind == "pixtral":
        # As mistral-community/pixtral-12b's config.json.
        config = LlavaConfig(
            text_config=text,
            vision_config=vision,
            image_token_index=ids[IMAGE],
            projector_hidden_act="gelu",
            vision_feature_layer=-1,
            vision_feature_select_strategy="full",
            multimodal_projector_bias=True,
            tie_word_embeddings=False,
            dtype="float32",
        )
        config.architectures = ["LlavaForConditionalGeneration"]
        return config
    config = Mistral3Config(
        text_config=text,
        vision_config=vision,
        image_token_index=ids[IMAGE],
        projector_hidden_act="gelu",
        vision_feature_layer=-1,
        multimodal_projector_bias=False,
        spatial_merge_size=PROCESSOR["mistral3"]["spatial_merge_size"],
        tie_word_embeddings=False,
        dtype="float32",
    )
    config.architectures = [ARCHITECTURE]
    return config


def _save_weights(config: Any, out_dir: Path, ids: dict[str, int]) -> None:
    from transformers import Mistral3ForConditionalGeneration

    from engine_server.tiny_models import save_model, seeded_model

    model = seeded_model(lambda: Mistral3ForConditionalGeneration(config))
    save_model(model, out_dir, bos_token_id=ids[BOS], eos_token_id=ids[EOS], pad_token_id=ids[PAD])
