"""Tiny random-weight Idefics3 and SmolVLM model directories, written at test time (no hub).

A Llama decoder under an Idefics3 (SigLIP-like) vision tower, one layer each, head_dim 32 in
both (vLLM's CPU attention), seeded random weights; our locally trained BPE with the family's
special tokens (`<fake_token_around_image>`, `<image>`, `<end_of_utterance>`, `<global-img>`,
`<row_R_col_C>` for a 6x6 grid) as added tokens, vocab = len(tokenizer); and the released
image-processor settings, LANCZOS included (`resample` picks another filter, for tests).

- `IDEFICS3` (model_type `idefics3`): HuggingFaceM4/Idefics3-8B-Llama3's chat template
  ("User:<image>...<end_of_utterance>\\nAssistant:") and preprocessor config: tiles of 364px
  (the vision image_size, 14px patches, scale_factor 2: 169 `<image>` per tile), the long edge
  resized to 1456 (at most 4x4 tiles plus the global one), mean/std 0.5.
- `SMOLVLM` (model_type `smolvlm`, SmolVLM2): transformers' SmolVLM chat template (its
  DEFAULT_CHAT_TEMPLATE, "<|im_start|>User:<image>..."), SmolLM2's `<|im_start|>` /
  `<|im_end|>` specials, the token strings also named in the tokenizer config as
  SmolVLMProcessor reads them, and SmolVLM2-256M/500M's image geometry: tiles of 512px (16px
  patches, scale_factor 4: 64 `<image>` per tile), the long edge resized to 2048. Building it
  needs the `num2words` package (transformers' SmolVLMProcessor refuses to start without).

The weights are drawn with initializer_range 0.3 in the decoder and 0.15 in the vision tower
(as fallback_models.py explains, small weights make greedy text ignore the prompt): with 0.15
in both, SmolVLM's greedy text was the same for 4 of 6 different 150x110 images (transformers'
generate); with these, all 6 differ in both variants, and
tests/e2e/gateway/test_family_idefics3.py asserts it on vLLM. Scaling the connector's output
up does nothing: the decoder normalizes each position before attending.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

IMAGE = "<image>"
FAKE = "<fake_token_around_image>"
GLOBAL = "<global-img>"
END_OF_UTTERANCE = "<end_of_utterance>"
GRID_SIDE = 6
TILE_TOKENS = tuple(
    f"<row_{r}_col_{c}>" for r in range(1, GRID_SIDE + 1) for c in range(1, GRID_SIDE + 1)
)
IMAGE_SPECIALS = (FAKE, IMAGE, END_OF_UTTERANCE, GLOBAL, *TILE_TOKENS)

# HuggingFaceM4/Idefics3-8B-Llama3's chat template, verbatim.
IDEFICS3_TEMPLATE = (
    "<|begin_of_text|>{% for message in messages %}{{message['role'].capitalize()}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)

LANCZOS, BILINEAR, BICUBIC = 1, 2, 3


@dataclass(frozen=True)
class Variant:
    """One family's released settings, as far as the tiny model takes them."""

    model_type: str
    tile: int  # vision image_size = max_image_size.longest_edge
    patch: int
    scale_factor: int
    tiles_per_edge: int  # size.longest_edge = tiles_per_edge * tile
    bos: str
    pad: str
    text_specials: tuple[str, ...]  # before the image specials in the vocabulary
    named_tokens: dict[str, str] = field(default_factory=dict)  # tokenizer attributes

    @property
    def image_seq_len(self) -> int:
        return (self.tile // self.patch) ** 2 // self.scale_factor**2

    @property
    def longest_edge(self) -> int:
        return self.tiles_per_edge * self.tile

    def image_processor_kwargs(self, resample: int) -> dict[str, Any]:
        """The released preprocessor_config.json's values (both families' read the same)."""
        return {
            "do_convert_rgb": True,
            "do_image_splitting": True,
            "do_normalize": True,
            "do_pad": True,
            "do_rescale": True,
            "do_resize": True,
            "image_mean": [0.5, 0.5, 0.5],
            "image_std": [0.5, 0.5, 0.5],
            "max_image_size": {"longest_edge": self.tile},
            "resample": resample,
            "rescale_factor": 1 / 255,
            "size": {"longest_edge": self.longest_edge},
        }


IDEFICS3 = Variant(
    model_type="idefics3",
    tile=364,
    patch=14,
    scale_factor=2,
    tiles_per_edge=4,
    bos="<|begin_of_text|>",
    pad="<|reserved_special_token_0|>",
    text_specials=("<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>"),
)
SMOLVLM = Variant(
    model_type="smolvlm",
    tile=512,
    patch=16,
    scale_factor=4,
    tiles_per_edge=4,
    bos="<|im_start|>",
    pad="<|im_end|>",
    text_specials=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
    named_tokens={
        "image_token": IMAGE,
        "fake_image_token": FAKE,
        "global_image_token": GLOBAL,
        "end_of_utterance_token": END_OF_UTTERANCE,
    },
)
VARIANTS = {v.model_type: v for v in (IDEFICS3, SMOLVLM)}
# Kept for the tests written against Idefics3's numbers.
TILE = IDEFICS3.tile
IMAGE_SEQ_LEN = IDEFICS3.image_seq_len  # 169

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
    "initializer_range": 0.3,
}
_VISION: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "initializer_range": 0.15,
}


def chat_template(variant: Variant) -> str:
    if variant is IDEFICS3:
        return IDEFICS3_TEMPLATE
    from transformers.models.smolvlm.processing_smolvlm import DEFAULT_CHAT_TEMPLATE

    return DEFAULT_CHAT_TEMPLATE


def _tokenizer(variant: Variant) -> Any:
    from engine_server.tiny_models import fast_tokenizer

    extra = {"extra_special_tokens": dict(variant.named_tokens)} if variant.named_tokens else {}
    return fast_tokenizer(
        (*variant.text_specials, *IMAGE_SPECIALS),
        bos_token=variant.bos,
        eos_token=END_OF_UTTERANCE,
        pad_token=variant.pad,
        chat_template=chat_template(variant),
        model_max_length=_TEXT["max_position_embeddings"],
        **extra,
    )


def build_model(
    out_dir: Path, weights: bool = True, resample: int = LANCZOS, variant: Variant = IDEFICS3
) -> Path:
    """Write a tiny model of `variant` (config, weights when `weights`, tokenizer, processor)."""
    from engine_server.tiny_models import save_processor, token_ids

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer(variant)
    names = (variant.bos, variant.pad, IMAGE, END_OF_UTTERANCE)
    ids = token_ids(tokenizer, names)
    text = {
        **_TEXT,
        "vocab_size": len(tokenizer),
        "bos_token_id": ids[variant.bos],
        "eos_token_id": ids[END_OF_UTTERANCE],
        "pad_token_id": ids[variant.pad],
        "tie_word_embeddings": False,
    }
    vision = {**_VISION, "image_size": variant.tile, "patch_size": variant.patch}
    classes = _classes(variant)
    config = classes["config"](
        text_config=text,
        vision_config=vision,
        image_token_id=ids[IMAGE],
        scale_factor=variant.scale_factor,
        pad_token_id=ids[variant.pad],
        tie_word_embeddings=False,
        dtype="float32",
    )
    config.architectures = [classes["model"].__name__]
    if weights:
        _save_weights(classes["model"], config, ids, variant, out_dir)
    else:
        config.save_pretrained(out_dir)
    image_processor = classes["image_processor"](**variant.image_processor_kwargs(resample))
    extra = (
        {"video_processor": classes["video_processor"]()} if "video_processor" in classes else {}
    )
    processor = classes["processor"](
        image_processor=image_processor,
        tokenizer=tokenizer,
        image_seq_len=variant.image_seq_len,
        chat_template=chat_template(variant),
        **extra,
    )
    pre = {**image_processor.to_dict(), "processor_class": classes["processor"].__name__}
    save_processor(processor, tokenizer, out_dir, chat_template(variant), pre)
    return out_dir


def _classes(variant: Variant) -> dict[str, Any]:
    if variant is IDEFICS3:
        from transformers import (
            Idefics3Config,
            Idefics3ForConditionalGeneration,
            Idefics3ImageProcessor,
            Idefics3Processor,
        )

        return {
            "config": Idefics3Config,
            "model": Idefics3ForConditionalGeneration,
            "image_processor": Idefics3ImageProcessor,
            "processor": Idefics3Processor,
        }
    from transformers import (
        SmolVLMConfig,
        SmolVLMForConditionalGeneration,
        SmolVLMImageProcessor,
        SmolVLMProcessor,
        SmolVLMVideoProcessor,
    )

    return {
        "config": SmolVLMConfig,
        "model": SmolVLMForConditionalGeneration,
        "image_processor": SmolVLMImageProcessor,
        "video_processor": SmolVLMVideoProcessor,
        "processor": SmolVLMProcessor,
    }


def _save_weights(
    model_class: Any, config: Any, ids: dict[str, int], variant: Variant, out_dir: Path
) -> None:
    from engine_server.tiny_models import save_model, seeded_model

    model = seeded_model(lambda: model_class(config))
    save_model(
        model,
        out_dir,
        bos_token_id=ids[variant.bos],
        eos_token_id=ids[END_OF_UTTERANCE],
        pad_token_id=ids[variant.pad],
    )
