"""A tiny Qwen2-Audio model directory (Qwen2AudioForConditionalGeneration), written at test time.

Qwen2-Audio is a Whisper-like audio encoder (128 mel bins, 30 s windows of 3000 frames, a
conv stride of 2 then a pool of 2: ((L-1)//2+1-2)//2+1 tokens for L mel frames) projected into
a Qwen2 decoder. The decoder dims and BPE are the tiny Qwen ones (`engine_server.tiny_models`)
with the three audio tokens appended; the template is the one transformers ships with
Qwen2AudioProcessor (`Audio N: <|audio_bos|><|AUDIO|><|audio_eos|>\\n`), and the feature
extractor settings are the released checkpoint's (Qwen/Qwen2-Audio-7B-Instruct).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine_server import tiny_models as tm

AUDIO = "<|AUDIO|>"
AUDIO_BOS = "<|audio_bos|>"
AUDIO_EOS = "<|audio_eos|>"
SPECIAL_TOKENS = (*tm.QWEN_SPECIAL_TOKENS, AUDIO, AUDIO_BOS, AUDIO_EOS)

# The released preprocessor_config.json of Qwen/Qwen2-Audio-7B-Instruct (a WhisperFeatureExtractor).
FEATURE_EXTRACTOR: dict[str, Any] = {
    "chunk_length": 30,
    "feature_extractor_type": "WhisperFeatureExtractor",
    "feature_size": 128,
    "hop_length": 160,
    "n_fft": 400,
    "n_samples": 480000,
    "nb_max_frames": 3000,
    "padding_side": "right",
    "padding_value": 0.0,
    "processor_class": "Qwen2AudioProcessor",
    "return_attention_mask": True,
    "sampling_rate": 16000,
}

# A tiny encoder: what vLLM runs is transformers' own Qwen2AudioEncoder, so no CPU attention
# kernel constrains its head dim. The 1500 positions (30 s) are fixed by the feature extractor.
AUDIO_CONFIG: dict[str, Any] = {
    "num_mel_bins": 128,
    "encoder_layers": 2,
    "encoder_attention_heads": 2,
    "encoder_ffn_dim": 128,
    "d_model": 64,
    "max_source_positions": 1500,
    "initializer_range": 0.5,
}


def tokenizer(template: str | None = None) -> Any:
    """The tiny Qwen tokenizer with the audio tokens; `template` defaults to the one
    Qwen2AudioProcessor ships."""
    from transformers import Qwen2AudioProcessor

    if template is None:
        template = Qwen2AudioProcessor.default_chat_template.fget(None)  # a property on the class
    return tm.fast_tokenizer(
        SPECIAL_TOKENS,
        eos_token=tm.IM_END,
        pad_token=tm.ENDOFTEXT,
        chat_template=template,
        model_max_length=tm.TEXT_DIMS["max_position_embeddings"],
    )


def build_model(out_dir: Path) -> Path:
    """A Qwen2-Audio dir with random weights (float32), its tokenizer, template and processor."""
    from transformers import (
        Qwen2AudioConfig,
        Qwen2AudioForConditionalGeneration,
        Qwen2AudioProcessor,
        WhisperFeatureExtractor,
    )

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = tokenizer()
    template = tok.chat_template
    text = {**tm.text_config_kwargs(tok), "model_type": "qwen2", "tie_word_embeddings": True}
    config = Qwen2AudioConfig(
        audio_config=AUDIO_CONFIG,
        text_config=text,
        audio_token_index=tok.convert_tokens_to_ids(AUDIO),
        dtype="float32",
    )
    model = tm.seeded_model(lambda: Qwen2AudioForConditionalGeneration(config))
    tm.save_decoder(model, tok, out_dir, template)
    _rename_decoder_weights(out_dir / "model.safetensors")
    settings = {k: v for k, v in FEATURE_EXTRACTOR.items() if k != "processor_class"}
    extractor = WhisperFeatureExtractor(**settings)
    processor = Qwen2AudioProcessor(extractor, tok, chat_template=template)
    tm.save_processor(processor, tok, out_dir, template, preprocessor=FEATURE_EXTRACTOR)
    return out_dir


def _rename_decoder_weights(path: Path) -> None:
    # transformers 5.19 saves the decoder as "language_model.model.model.*" (its reverse name
    # mapping adds a level); released checkpoints, vLLM's loader and transformers' own loader
    # read "language_model.model.*".
    from safetensors.torch import load_file, save_file

    wrong = "language_model.model.model."
    weights = {
        ("language_model.model." + k.removeprefix(wrong) if k.startswith(wrong) else k): v
        for k, v in load_file(path).items()
    }
    save_file(weights, path, metadata={"format": "pt"})
