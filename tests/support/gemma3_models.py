"""A tiny random-weight Gemma 3 model directory (`gemma3`, Gemma3ForConditionalGeneration),
written at test time, for the Gemma 3 processor's parity tests, its end-to-end test against
vLLM's own server, and the preprocessing benchmark.

What is as released (google/gemma-3-4b-it): the chat template, the special tokens (as added
tokens of our locally trained BPE), the flat `preprocessor_config.json` (896x896 SigLIP input,
bilinear, mean/std 0.5, pan-and-scan keys left null, so the processor's defaults apply), the
SigLIP patch size 14 and the vision weights' `vision_tower.vision_model.*` names. What is
shrunk: the towers (2 layers each, head dim 32) and `mm_tokens_per_image` = image_seq_length =
64 instead of 256 (the 64x64 patch grid average-pooled by 8 instead of by 4), so that an image
is 68 prompt tokens.

Random weights answer with varied text only with an untied, random `lm_head` (tied, the
residual stream keeps the last prompt token's embedding, so the model repeats "\\n" forever) and
an initializer range of 0.3; 64 tokens per image (rather than 16, each pooled over 4x more
patches) and a random projector (transformers leaves it at zero) make the answer change with
the image for most of the e2e test's images.

vLLM's Gemma 3 processor looks the strings "\\n" ... "\\n\\n\\n\\n" up in the vocabulary (it
fuses the newlines its image replacement puts next to the prompt's), so they are added tokens
here, as they are single tokens of the released vocabulary; not special, so decoded text keeps
them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

MODEL_TYPE = "gemma3"
ARCHITECTURE = "Gemma3ForConditionalGeneration"
PAD, EOS, BOS, UNK = "<pad>", "<eos>", "<bos>", "<unk>"
START_OF_TURN, END_OF_TURN = "<start_of_turn>", "<end_of_turn>"
# What the chat template writes per image (boi), what closes the image (eoi), and the token each
# image embedding replaces.
BOI, EOI, IMAGE_SOFT = "<start_of_image>", "<end_of_image>", "<image_soft_token>"
SPECIAL_TOKENS = (PAD, EOS, BOS, UNK, START_OF_TURN, END_OF_TURN, BOI, EOI, IMAGE_SOFT)
NEWLINES = ("\n", "\n\n", "\n\n\n", "\n\n\n\n")

# google/gemma-3-4b-it's chat template, verbatim apart from line wrapping: each image part is
# one <start_of_image>, which the processor expands; text parts are trimmed.
CHAT_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    '    {%- set first_user_prefix = "" -%}\n'
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    '        {{ raise_exception("Conversation roles must alternate '
    'user/assistant/user/assistant/...") }}\n'
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    '        {%- set role = "model" -%}\n'
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    '        {{ raise_exception("Invalid content type") }}\n'
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\n'}}\n"
    "{%- endif -%}\n"
)

# google/gemma-3-4b-it's preprocessor_config.json, verbatim (transformers 4.x's flat layout).
PREPROCESSOR: dict[str, Any] = {
    "do_convert_rgb": None,
    "do_normalize": True,
    "do_pan_and_scan": None,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_processor_type": "Gemma3ImageProcessor",
    "image_seq_length": 256,
    "image_std": [0.5, 0.5, 0.5],
    "pan_and_scan_max_num_crops": None,
    "pan_and_scan_min_crop_size": None,
    "pan_and_scan_min_ratio_to_activate": None,
    "processor_class": "Gemma3Processor",
    "resample": 2,
    "rescale_factor": 1 / 255,
    "size": {"height": 896, "width": 896},
}
IMAGE_SEQ_LENGTH = 64  # released: 256; a perfect square whose side divides the 64x64 grid

_TEXT: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,  # vLLM's CPU attention takes 32/64/...
    "query_pre_attn_scalar": 32,  # released: = head_dim
    "sliding_window": 64,  # released: 1024; shorter than the e2e prompts, so layer 0 slides
    "layer_types": ["sliding_attention", "full_attention"],
    "max_position_embeddings": 4096,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
    },
    "rms_norm_eps": 1e-6,
    "hidden_activation": "gelu_pytorch_tanh",
    # At transformers' 0.02 a random model repeats one token; wider weights make greedy text
    # varied and dependent on the image (fallback_models.py tells the same story).
    "initializer_range": 0.3,
    "tie_word_embeddings": False,  # released: tied (see the module docstring)
}
_VISION: dict[str, Any] = {
    "model_type": "siglip_vision_model",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,  # head_dim 32
    "image_size": 896,
    "patch_size": 14,
    "layer_norm_eps": 1e-6,
    "vision_use_head": False,
}


def build_model(out_dir: Path, weights: bool = True) -> Path:
    """Write the tiny Gemma 3 model into `out_dir`: config, tokenizer, chat template,
    preprocessor config, and with `weights` seeded random weights (a few MB)."""
    from transformers import Gemma3Config, Gemma3ImageProcessor, Gemma3Processor

    from engine_server.tiny_models import save_processor, token_ids

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer()
    ids = token_ids(tokenizer, SPECIAL_TOKENS)
    config = Gemma3Config(
        text_config={
            **_TEXT,
            "vocab_size": len(tokenizer),
            "pad_token_id": ids[PAD],
            "eos_token_id": ids[EOS],
            "bos_token_id": ids[BOS],
        },
        vision_config=dict(_VISION),
        mm_tokens_per_image=IMAGE_SEQ_LENGTH,
        boi_token_index=ids[BOI],
        eoi_token_index=ids[EOI],
        image_token_index=ids[IMAGE_SOFT],
        initializer_range=_TEXT["initializer_range"],
        tie_word_embeddings=False,
        eos_token_id=[ids[EOS], ids[END_OF_TURN]],
        dtype="float32",
    )
    config.architectures = [ARCHITECTURE]
    if weights:
        _save_weights(config, ids, out_dir)
    else:
        config.save_pretrained(out_dir)
    # The image processor's own settings: the released ones that are set.
    skip = ("processor_class", "image_processor_type", "image_seq_length")
    pixels = {k: v for k, v in PREPROCESSOR.items() if k not in skip and v is not None}
    image_processor = Gemma3ImageProcessor(**pixels)
    processor = Gemma3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
        image_seq_length=IMAGE_SEQ_LENGTH,
    )
    pre = {**PREPROCESSOR, "image_seq_length": IMAGE_SEQ_LENGTH}
    save_processor(processor, tokenizer, out_dir, CHAT_TEMPLATE, pre)
    return out_dir


def _tokenizer() -> Any:
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    from engine_server.tiny_models import base_tokenizer

    tok = base_tokenizer(SPECIAL_TOKENS)
    # Single tokens as in Gemma's vocabulary; added (not learned) so the longest run wins.
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in NEWLINES])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        extra_special_tokens={"boi_token": BOI, "eoi_token": EOI, "image_token": IMAGE_SOFT},
        chat_template=CHAT_TEMPLATE,
        model_max_length=_TEXT["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )


def _save_weights(config: Any, ids: dict[str, int], out_dir: Path) -> None:
    import torch
    from transformers import Gemma3ForConditionalGeneration

    from engine_server.tiny_models import save_model, seeded_model

    def with_projector() -> Any:
        model = Gemma3ForConditionalGeneration(config)
        # transformers leaves the projection at zero: images would not change the answer.
        projector = model.model.multi_modal_projector.mm_input_projection_weight
        with torch.no_grad():
            projector.normal_(0.0, config.initializer_range)
        return model

    model = seeded_model(with_projector)  # the projector's init drawn under the seed too
    save_model(
        model,
        out_dir,
        bos_token_id=ids[BOS],
        eos_token_id=[ids[EOS], ids[END_OF_TURN]],
        pad_token_id=ids[PAD],
    )
    _rename_vision_weights(out_dir / "model.safetensors")


def _rename_vision_weights(path: Path) -> None:
    # transformers 5 saves the SigLIP tower's weights without the "vision_model." level (and
    # maps the old names on load); released checkpoints, and vLLM's loader, keep it.
    from safetensors.torch import load_file, save_file

    def released(name: str) -> str:
        for prefix in ("model.vision_tower.", "vision_tower."):
            rest = name.removeprefix(prefix)
            if rest != name and not rest.startswith("vision_model."):
                return prefix + "vision_model." + rest
        return name

    weights = {released(k): v for k, v in load_file(path).items()}
    save_file(weights, path, metadata={"format": "pt"})
