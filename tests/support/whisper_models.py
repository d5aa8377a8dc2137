"""A tiny Whisper model directory (WhisperForConditionalGeneration), written at test time, for
/v1/audio/transcriptions and /v1/audio/translations.

vLLM serves Whisper as an encoder-decoder for speech-to-text only (no chat). Its prompts name
Whisper's special tokens by text: `<|startoftranscript|><|en|><|transcribe|><|notimestamps|>`,
the language-detection pass constrains the first token to `<|xx|>` of every language it knows,
and verbose_json/srt/vtt segments read timestamp tokens from `<|0.00|>` up. So the tokenizer is
the tiny shared BPE with the released multilingual Whisper's added tokens in the released order:
<|endoftext|>, <|startoftranscript|>, one token per language of transformers' LANGUAGES,
<|translate|>, <|transcribe|>, <|startoflm|>, <|startofprev|>, <|nospeech|>, <|notimestamps|>,
then the 1501 timestamps <|0.00|> ... <|30.00|> (not special, as released). The feature
extractor is the released 80-bin one (openai/whisper-tiny ... -large-v2).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine_server import tiny_models as tm

ENDOFTEXT = "<|endoftext|>"
START_OF_TRANSCRIPT = "<|startoftranscript|>"
NO_TIMESTAMPS = "<|notimestamps|>"
TASK_TOKENS = ("<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>")
NO_SPEECH = "<|nospeech|>"
TIMESTAMPS = tuple(f"<|{i * 0.02:.2f}|>" for i in range(1501))

# The released preprocessor_config.json of the 80-bin Whisper checkpoints.
FEATURE_EXTRACTOR: dict[str, Any] = {
    "chunk_length": 30,
    "feature_extractor_type": "WhisperFeatureExtractor",
    "feature_size": 80,
    "hop_length": 160,
    "n_fft": 400,
    "n_samples": 480000,
    "nb_max_frames": 3000,
    "padding_side": "right",
    "padding_value": 0.0,
    "return_attention_mask": False,
    "sampling_rate": 16000,
}

# head_dim 64 / 2 = 32: vLLM runs Whisper's attention on its own CPU kernels. 1500 encoder
# positions are 30 s of features; 448 decoder positions are the released limit (the server's
# max model len).
DIMS: dict[str, Any] = {
    "num_mel_bins": 80,
    "d_model": 64,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 2,
    "decoder_attention_heads": 2,
    "encoder_ffn_dim": 128,
    "decoder_ffn_dim": 128,
    "max_source_positions": 1500,
    "max_target_positions": 448,
    "init_std": 0.5,
}


def special_tokens() -> tuple[str, ...]:
    """Whisper's special tokens in the released order (timestamps excluded)."""
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    languages = tuple(f"<|{code}|>" for code in LANGUAGES)
    return (
        ENDOFTEXT,
        START_OF_TRANSCRIPT,
        *languages,
        *TASK_TOKENS,
        NO_SPEECH,
        NO_TIMESTAMPS,
    )


def tokenizer() -> Any:
    """The tiny BPE with Whisper's special tokens and its timestamp tokens."""
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    backend = tm.base_tokenizer(special_tokens())
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in TIMESTAMPS])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=ENDOFTEXT,
        eos_token=ENDOFTEXT,
        pad_token=ENDOFTEXT,
        unk_token=ENDOFTEXT,
        model_max_length=DIMS["max_target_positions"],
        clean_up_tokenization_spaces=False,
    )


def build_model(out_dir: Path) -> Path:
    """A Whisper dir with random weights (float32), its tokenizer and WhisperProcessor."""
    from transformers import (
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperProcessor,
    )

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = tokenizer()
    ids = tm.token_ids(tok, (ENDOFTEXT, START_OF_TRANSCRIPT))
    config = WhisperConfig(
        **DIMS,
        vocab_size=len(tok),
        bos_token_id=ids[ENDOFTEXT],
        eos_token_id=ids[ENDOFTEXT],
        pad_token_id=ids[ENDOFTEXT],
        decoder_start_token_id=ids[START_OF_TRANSCRIPT],
        begin_suppress_tokens=None,
        suppress_tokens=None,
        dtype="float32",
    )
    model = tm.seeded_model(lambda: WhisperForConditionalGeneration(config))
    tm.save_model(
        model,
        out_dir,
        bos_token_id=ids[ENDOFTEXT],
        eos_token_id=ids[ENDOFTEXT],
        pad_token_id=ids[ENDOFTEXT],
        decoder_start_token_id=ids[START_OF_TRANSCRIPT],
    )
    extractor = WhisperFeatureExtractor(**FEATURE_EXTRACTOR)
    processor = WhisperProcessor(feature_extractor=extractor, tokenizer=tok)
    preprocessor = {**FEATURE_EXTRACTOR, "processor_class": "WhisperProcessor"}
    tm.save_processor(processor, tok, out_dir, None, preprocessor=preprocessor)
    return out_dir
