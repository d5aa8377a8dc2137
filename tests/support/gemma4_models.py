"""A tiny random-weight Gemma 4 model directory (`gemma4`, Gemma4ForConditionalGeneration),
written at test time, for the Gemma 4 processor's parity tests, its end-to-end test against
vLLM's own server, and the preprocessing benchmark.

What is as released (google/gemma-4-E2B-it): the special tokens (as added tokens of our
locally trained BPE, with the tokenizer's named ones: `<|image>` boi, `<image|>` eoi,
`<|image|>` image, the audio trio, `<|turn>` / `<turn|>` ...), the chat template's message
and image structure (below), the image processor's settings (transformers 5's nested
`processor_config.json`: aspect-preserving bicubic resize to a budget of 280 soft tokens,
16 px patches pooled 3x3, rescale to [0, 1], no normalization), the vision tower's geometry
(patch 16, pooling 3, 280 soft tokens by default). What is shrunk: both towers (2 layers,
head dims 32 for sliding and 64 for global attention), the text model's per-layer input
embeddings (off, as in the 26B/31B checkpoints) and the vision position table (4096
positions rather than 10240: still more than the 3360 patches a side can reach at 1120
tokens).

vLLM reads `vision_config.default_output_length` (the default soft-token budget), which
transformers 5 does not write: it is added to config.json here, as released configs have it.

Random weights answer with text that depends on the image only with wider weights
(initializer range 0.3, as the tiny Gemma 3) and an untied, random `lm_head`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MODEL_TYPE = "gemma4"
ARCHITECTURE = "Gemma4ForConditionalGeneration"
PAD, EOS, BOS, UNK, MASK = "<pad>", "<eos>", "<bos>", "<unk>", "<mask>"
TURN_START, TURN_END = "<|turn>", "<turn|>"
BOI, EOI, IMAGE = "<|image>", "<image|>", "<|image|>"
BOA, EOA, AUDIO = "<|audio>", "<audio|>", "<|audio|>"
VIDEO = "<|video|>"
# The tokenizer's named tokens besides the image and audio ones (tokenizer_config.json).
NAMED: dict[str, str] = {
    "sot_token": TURN_START,
    "eot_token": TURN_END,
    "soc_token": "<|channel>",
    "eoc_token": "<channel|>",
    "think_token": "<|think|>",
    "escape_token": '<|"|>',
    "str_token": "<|tool_response>",
    "etr_token": "<tool_response|>",
    "stc_token": "<|tool_call>",
    "etc_token": "<tool_call|>",
    "std_token": "<|tool>",
    "etd_token": "<tool|>",
}
MEDIA: dict[str, str] = {
    "image_token": IMAGE,
    "boi_token": BOI,
    "eoi_token": EOI,
    "audio_token": AUDIO,
    "boa_token": BOA,
    "eoa_token": EOA,
}
SPECIAL_TOKENS = (PAD, EOS, BOS, UNK, MASK, *MEDIA.values(), VIDEO, *NAMED.values())

# google/gemma-4-E2B-it's chat template, cut to what a chat of text and images renders: the
# optional system turn (with `<|think|>` when thinking is on), one `<|turn>role` ... `<turn|>`
# per message with text parts trimmed and one `<|image|>` per image part (which vLLM expands),
# the model's earlier thinking stripped, and `<|turn>model` as the generation prompt. The
# released template's tool declarations, calls and responses are left out: they render no
# image.
CHAT_TEMPLATE = """\
{%- macro strip_thinking(text) -%}
    {%- set ns = namespace(result='') -%}
    {%- for part in text.split('<channel|>') -%}
        {%- if '<|channel>' in part -%}
            {%- set ns.result = ns.result + part.split('<|channel>')[0] -%}
        {%- else -%}
            {%- set ns.result = ns.result + part -%}
        {%- endif -%}
    {%- endfor -%}
    {{- ns.result | trim -}}
{%- endmacro -%}
{%- set loop_messages = messages -%}
{{- bos_token -}}
{%- if (enable_thinking is defined and enable_thinking) or messages[0]['role'] in ['system', \
'developer'] -%}
    {{- '<|turn>system\\n' -}}
    {%- if enable_thinking is defined and enable_thinking -%}
        {{- '<|think|>\\n' -}}
    {%- endif -%}
    {%- if messages[0]['role'] in ['system', 'developer'] -%}
        {{- messages[0]['content'] | trim -}}
        {%- set loop_messages = messages[1:] -%}
    {%- endif -%}
    {{- '<turn|>\\n' -}}
{%- endif %}
{%- for message in loop_messages -%}
    {%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
    {{- '<|turn>' + role + '\\n' }}
    {%- if message['content'] is string -%}
        {%- if role == 'model' -%}
            {{- strip_thinking(message['content']) -}}
        {%- else -%}
            {{- message['content'] | trim -}}
        {%- endif -%}
    {%- elif message['content'] is sequence -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'text' -%}
                {%- if role == 'model' -%}
                    {{- strip_thinking(item['text']) -}}
                {%- else -%}
                    {{- item['text'] | trim -}}
                {%- endif -%}
            {%- elif item['type'] == 'image' -%}
                {{- '<|image|>' -}}
            {%- elif item['type'] == 'audio' -%}
                {{- '<|audio|>' -}}
            {%- elif item['type'] == 'video' -%}
                {{- '<|video|>' -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
    {{- '<turn|>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|turn>model\\n' -}}
{%- endif -%}
"""

# google/gemma-4-E2B-it's processor_config.json "image_processor" entry (transformers 5 nests
# it there; the checkpoint has no flat preprocessor_config.json).
IMAGE_PROCESSOR: dict[str, Any] = {
    "do_convert_rgb": True,
    "do_normalize": False,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.0, 0.0, 0.0],
    "image_processor_type": "Gemma4ImageProcessor",
    "image_seq_length": 280,
    "image_std": [1.0, 1.0, 1.0],
    "max_soft_tokens": 280,
    "patch_size": 16,
    "pooling_kernel_size": 3,
    "resample": 3,
    "rescale_factor": 1 / 255,
}
SOFT_TOKENS = IMAGE_PROCESSOR["max_soft_tokens"]

_TEXT: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,  # sliding layers; vLLM's CPU attention takes 32/64/...
    "global_head_dim": 64,  # full-attention layers (released: 512)
    "sliding_window": 128,  # released: 512; shorter than an image, so layer 0 slides
    "layer_types": ["sliding_attention", "full_attention"],
    "max_position_embeddings": 8192,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        "full_attention": {
            "rope_type": "proportional",
            "partial_rotary_factor": 0.25,
            "rope_theta": 1_000_000.0,
        },
    },
    "rms_norm_eps": 1e-6,
    "hidden_activation": "gelu_pytorch_tanh",
    "final_logit_softcapping": 30.0,
    "hidden_size_per_layer_input": 0,  # no per-layer input embeddings
    # At transformers' 0.02 a random model repeats one token; wider weights make greedy text
    # varied and dependent on the image (as the tiny Gemma 3).
    "initializer_range": 0.3,
    "tie_word_embeddings": False,
}
_VISION: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "patch_size": IMAGE_PROCESSOR["patch_size"],
    "pooling_kernel_size": IMAGE_PROCESSOR["pooling_kernel_size"],
    "position_embedding_size": 4096,
    "rms_norm_eps": 1e-6,
    "initializer_range": 0.3,
}


def build_model(out_dir: Path, weights: bool = True) -> Path:
    """Write the tiny Gemma 4 model into `out_dir`: config, tokenizer, chat template,
    processor config, and with `weights` seeded random weights (a few MB)."""
    from transformers import (
        Gemma4AudioFeatureExtractor,
        Gemma4Config,
        Gemma4ImageProcessor,
        Gemma4Processor,
        Gemma4VideoProcessor,
    )

    from engine_server.tiny_models import save_processor, token_ids

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer()
    ids = token_ids(tokenizer, SPECIAL_TOKENS)
    vocab = len(tokenizer)
    config = Gemma4Config(
        text_config={
            **_TEXT,
            "vocab_size": vocab,
            "vocab_size_per_layer_input": vocab,
            "pad_token_id": ids[PAD],
            "eos_token_id": ids[EOS],
            "bos_token_id": ids[BOS],
        },
        vision_config=dict(_VISION),
        audio_config=None,
        boi_token_id=ids[BOI],
        eoi_token_id=ids[EOI],
        image_token_id=ids[IMAGE],
        video_token_id=ids[VIDEO],
        boa_token_id=ids[BOA],
        eoa_token_index=ids[EOA],
        audio_token_id=ids[AUDIO],
        initializer_range=_TEXT["initializer_range"],
        tie_word_embeddings=False,
        eos_token_id=[ids[EOS], ids[TURN_END]],
        dtype="float32",
    )
    config.architectures = [ARCHITECTURE]
    if weights:
        _save_weights(config, ids, out_dir)
    else:
        config.save_pretrained(out_dir)
    _add_default_output_length(out_dir / "config.json")
    pixels = {k: v for k, v in IMAGE_PROCESSOR.items() if k not in ("image_processor_type",)}
    processor = Gemma4Processor(
        feature_extractor=Gemma4AudioFeatureExtractor(),
        image_processor=Gemma4ImageProcessor(**pixels),
        tokenizer=tokenizer,
        video_processor=Gemma4VideoProcessor(),
        chat_template=CHAT_TEMPLATE,
        image_seq_length=SOFT_TOKENS,
    )
    save_processor(processor, tokenizer, out_dir, CHAT_TEMPLATE)
    return out_dir


def _add_default_output_length(path: Path) -> None:
    config = json.loads(path.read_text())
    config["vision_config"]["default_output_length"] = SOFT_TOKENS
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _tokenizer() -> Any:
    from engine_server.tiny_models import fast_tokenizer

    return fast_tokenizer(
        SPECIAL_TOKENS,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        mask_token=MASK,
        extra_special_tokens={**MEDIA, **NAMED},
        chat_template=CHAT_TEMPLATE,
        model_max_length=_TEXT["max_position_embeddings"],
    )


def _save_weights(config: Any, ids: dict[str, int], out_dir: Path) -> None:
    from transformers import Gemma4ForConditionalGeneration

    from engine_server.tiny_models import save_model, seeded_model

    model = seeded_model(lambda: Gemma4ForConditionalGeneration(config))
    save_model(
        model,
        out_dir,
        bos_token_id=ids[BOS],
        eos_token_id=[ids[EOS], ids[TURN_END]],
        pad_token_id=ids[PAD],
    )
