"""A tiny random-weight Idefics3 model directory, written at test time (no hub access).

A Llama decoder under an Idefics3 (SigLIP-like) vision tower, one layer each, head_dim 32 in
both (vLLM's CPU attention), seeded random weights; our locally trained BPE with Idefics3's
special tokens (`<fake_token_around_image>`, `<image>`, `<end_of_utterance>`, `<global-img>`,
`<row_R_col_C>` for a 6x6 grid) as added tokens, vocab = len(tokenizer); the released chat
template (HuggingFaceM4/Idefics3-8B-Llama3: "User:<image>...<end_of_utterance>\\nAssistant:");
and the released preprocessor settings unchanged: tiles of 364px (the vision image_size, 14px
patches, scale_factor 2: 169 `<image>` per tile), the long edge resized to 1456 (at most 4x4
tiles plus the global one), mean/std 0.5, LANCZOS. `resample` picks another filter, for the
parity tests while the gateway's resize lacks LANCZOS.

SmolVLM is not built here: transformers' SmolVLMProcessor needs the `num2words` package,
which the venv lacks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

MODEL_TYPE = "idefics3"
IMAGE = "<image>"
FAKE = "<fake_token_around_image>"
GLOBAL = "<global-img>"
END_OF_UTTERANCE = "<end_of_utterance>"
BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
PAD = "<|reserved_special_token_0|>"
GRID_SIDE = 6
TILE_TOKENS = tuple(
    f"<row_{r}_col_{c}>" for r in range(1, GRID_SIDE + 1) for c in range(1, GRID_SIDE + 1)
)
SPECIAL_TOKENS = (BOS, EOS, PAD, FAKE, IMAGE, END_OF_UTTERANCE, GLOBAL, *TILE_TOKENS)

# HuggingFaceM4/Idefics3-8B-Llama3's chat template, verbatim.
CHAT_TEMPLATE = (
    "<|begin_of_text|>{% for message in messages %}{{message['role'].capitalize()}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)

LANCZOS, BILINEAR, BICUBIC = 1, 2, 3
TILE = 364
# Idefics3-8B-Llama3's preprocessor_config.json.
IMAGE_PROCESSOR_KWARGS: dict[str, Any] = {
    "do_convert_rgb": True,
    "do_image_splitting": True,
    "do_normalize": True,
    "do_pad": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "max_image_size": {"longest_edge": TILE},
    "resample": LANCZOS,
    "rescale_factor": 1 / 255,
    "size": {"longest_edge": 4 * TILE},
}
SCALE_FACTOR = 2
PATCH = 14
IMAGE_SEQ_LEN = (TILE // PATCH) ** 2 // SCALE_FACTOR**2  # 169

SEED = 1234
_TEXT: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
    # As fallback_models.py explains: small enough that greedy text varies with the prompt.
    "initializer_range": 0.15,
}
_VISION: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "image_size": TILE,
    "patch_size": PATCH,
    "initializer_range": 0.15,
}


def _tokenizer() -> Any:
    from transformers import PreTrainedTokenizerFast

    from engine_server.tiny_models import _base_tokenizer

    return PreTrainedTokenizerFast(
        tokenizer_object=_base_tokenizer(SPECIAL_TOKENS),
        bos_token=BOS,
        eos_token=END_OF_UTTERANCE,
        pad_token=PAD,
        chat_template=CHAT_TEMPLATE,
        model_max_length=_TEXT["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )


def build_model(out_dir: Path, weights: bool = True, resample: int = LANCZOS) -> Path:
    """Write the tiny Idefics3 model (config, weights when `weights`, tokenizer, processor)."""
    from transformers import Idefics3Config, Idefics3ImageProcessor, Idefics3Processor

    from engine_server.tiny_models import _patch_tokenizer_files, _write_json

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer()
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in (BOS, PAD, IMAGE, END_OF_UTTERANCE)}
    text = {
        **_TEXT,
        "vocab_size": len(tokenizer),
        "bos_token_id": ids[BOS],
        "eos_token_id": ids[END_OF_UTTERANCE],
        "pad_token_id": ids[PAD],
        "tie_word_embeddings": False,
    }
    config = Idefics3Config(
        text_config=text,
        vision_config=dict(_VISION),
        image_token_id=ids[IMAGE],
        scale_factor=SCALE_FACTOR,
        pad_token_id=ids[PAD],
        tie_word_embeddings=False,
        dtype="float32",
    )
    config.architectures = ["Idefics3ForConditionalGeneration"]
    if weights:
        _save_weights(config, ids, out_dir)
    else:
        config.save_pretrained(out_dir)
    image_processor = Idefics3ImageProcessor(**{**IMAGE_PROCESSOR_KWARGS, "resample": resample})
    processor = Idefics3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        image_seq_len=IMAGE_SEQ_LEN,
        chat_template=CHAT_TEMPLATE,
    )
    processor.save_pretrained(out_dir)
    _patch_tokenizer_files(out_dir, tokenizer, CHAT_TEMPLATE)
    # Released checkpoints ship the flat preprocessor_config.json (transformers 4.x layout);
    # transformers 5 nests the same settings in processor_config.json.
    _write_json(
        out_dir / "preprocessor_config.json",
        {**image_processor.to_dict(), "processor_class": "Idefics3Processor"},
    )
    return out_dir


def _save_weights(config: Any, ids: dict[str, int], out_dir: Path) -> None:
    import torch
    from transformers import GenerationConfig, Idefics3ForConditionalGeneration

    # fork_rng keeps the caller's global RNG state untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = Idefics3ForConditionalGeneration(config).eval()
    # Only token ids: vLLM turns any sampling fields here into request defaults.
    model.generation_config = GenerationConfig(
        bos_token_id=ids[BOS], eos_token_id=ids[END_OF_UTTERANCE], pad_token_id=ids[PAD]
    )
    model.save_pretrained(out_dir)
