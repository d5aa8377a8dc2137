"""What vLLM 0.32 writes for Whisper's speech-to-text prompts and reads from its output
(vllm/model_executor/models/whisper.py, `WhisperForConditionalGeneration`, and the
speech-to-text server's `_get_verbose_segments`).

* The decoder prompt is text with Whisper's special tokens named:
  `<|startoftranscript|><|xx|><|transcribe|><|notimestamps|>` (`<|translate|>` to translate),
  a request `prompt` put before it as the literal text `<|prev|>` and the prompt (not the
  `<|startofprev|>` token), tokenized without special tokens. The renderer then puts the
  decoder start token in front when the ids do not begin with it: with a prompt they begin
  with `<|prev|>`, so the start of transcript is there twice.
* verbose_json asks for timestamps: every `<|notimestamps|>` of that text becomes `<|0.00|>`.
* Without a language, one greedy token after `<|startoftranscript|>`, restricted to the
  language tokens of the 57 languages vLLM lists, names it.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from tokenizers import Tokenizer

from gateway.errors import GatewayError
from gateway.render.renderer import token_ids

ARCHITECTURES = frozenset({"WhisperForConditionalGeneration"})
# vLLM's ISO639_1_SUPPORTED_LANGS (whisper_utils.py), in its order.
SUPPORTED_LANGUAGES: tuple[str, ...] = (
    "af", "ar", "hy", "az", "be", "bs", "bg", "ca", "zh", "hr", "cs", "da", "nl", "en", "et",
    "fi", "fr", "gl", "de", "el", "he", "hi", "hu", "is", "id", "it", "ja", "kn", "kk", "ko",
    "lv", "lt", "mk", "ms", "mr", "mi", "ne", "no", "fa", "pl", "pt", "ro", "ru", "sr", "sk",
    "sl", "es", "sw", "sv", "tl", "ta", "th", "tr", "uk", "ur", "vi", "cy",
)  # fmt: skip
# The rest of transformers' Whisper LANGUAGES: vLLM takes them with a warning.
OTHER_LANGUAGES = frozenset((
    "la", "ml", "te", "bn", "br", "eu", "mn", "sq", "pa", "si", "km", "sn", "yo", "so", "oc",
    "ka", "tg", "sd", "gu", "am", "yi", "lo", "uz", "fo", "ht", "ps", "tk", "nn", "mt", "sa",
    "lb", "my", "bo", "mg", "as", "tt", "haw", "ln", "ha", "ba", "jw", "su", "yue",
))  # fmt: skip
# Languages whose chunk texts are joined with no space (SupportsTranscription's default).
NO_SPACE_LANGUAGES = frozenset({"ja", "zh"})
START_OF_TRANSCRIPT = "<|startoftranscript|>"
FIRST_TIMESTAMP = "<|0.00|>"
TIMESTAMP_SECONDS = 0.02


def is_whisper(config: Mapping[str, Any]) -> bool:
    return bool(ARCHITECTURES & set(config.get("architectures") or ()))


def generation_refused() -> GatewayError:
    """For a transcription-only model, which generates from no text prompt: vLLM mounts no
    chat, completions, Responses or Messages route for it (a 404), and neither does the
    gateway."""
    return GatewayError(
        "this model only transcribes audio (/v1/audio/transcriptions, /v1/audio/translations); "
        "it serves no chat, completions, Responses or Messages API",
        404,
    )


def check_language(language: str | None) -> None:
    """vLLM's `validate_language`: a code of neither list is a 400."""
    if language is None or language in SUPPORTED_LANGUAGES or language in OTHER_LANGUAGES:
        return
    raise GatewayError(
        f"Unsupported language: {language!r}.  Must be one of {list(SUPPORTED_LANGUAGES)}.", 400
    )


def separator(language: str | None) -> str:
    """What goes between the texts of consecutive clips."""
    return "" if language and language.lower() in NO_SPACE_LANGUAGES else " "


def decoder_text(language: str, task: str, prompt: str, timestamps: bool) -> str:
    text = (f"<|prev|>{prompt}" if prompt else "") + (
        f"{START_OF_TRANSCRIPT}<|{language}|><|{task}|><|notimestamps|>"
    )
    return text.replace("<|notimestamps|>", FIRST_TIMESTAMP) if timestamps else text


def decoder_ids(tokenizer: Tokenizer, text: str, start_id: int) -> list[int]:
    """The decoder prompt's ids as vLLM's renderer makes them (the start token put first
    when missing)."""
    ids = token_ids(tokenizer, text, add_special_tokens=False)
    return ids if ids and ids[0] == start_id else [start_id, *ids]


def language_token_ids(tokenizer: Tokenizer) -> list[int]:
    """The tokens the language-detection pass may sample, in vLLM's order."""
    ids = [tokenizer.token_to_id(f"<|{code}|>") for code in SUPPORTED_LANGUAGES]
    if any(i is None for i in ids):
        raise GatewayError("the model's tokenizer lacks Whisper's language tokens", 500)
    return ids  # type: ignore[return-value]


def detected_language(tokenizer: Tokenizer, token: int) -> str:
    text = tokenizer.decode([token], skip_special_tokens=False)
    code = text[2:-2]
    if not (text.startswith("<|") and text.endswith("|>") and code in SUPPORTED_LANGUAGES):
        raise GatewayError(f"language detection answered {text!r}, not a language token", 502)
    return code


def segments(
    tokenizer: Tokenizer,
    tokens: Sequence[int],
    logprobs: Sequence[float],
    eos_id: int | None,
    start_time: float,
    temperature: float,
    first_id: int,
) -> list[dict[str, Any]]:
    """verbose_json's segments of one clip, as vLLM's `_get_verbose_segments` cuts them: a
    segment ends at each pair of consecutive timestamp tokens (ids from `first_id`, the
    `<|0.00|>` token, up); `logprobs[i]` is the sampled token i's."""
    tokens = tuple(tokens)
    if tokens and tokens[-1] == eos_id:
        tokens = tokens[:-1]
    marked = (first_id, *tokens)
    if len(marked) >= 2 and marked[-2] < first_id <= marked[-1]:
        marked = (*marked, marked[-1])  # a last timestamp closes the last segment
    out: list[dict[str, Any]] = []
    last_start, logprob_sum = 0, 0.0
    for idx in range(1, len(marked)):
        token = marked[idx]
        if token >= first_id and marked[idx - 1] >= first_id:
            piece = marked[last_start:idx]
            text = tokenizer.decode(list(piece[1:-1]), skip_special_tokens=False)
            data = text.encode("utf-8")
            out.append(
                {
                    "id": len(out),
                    "avg_logprob": logprob_sum / (idx - last_start),
                    "compression_ratio": len(data) / len(zlib.compress(data)),
                    "end": start_time + TIMESTAMP_SECONDS * (piece[-1] - first_id),
                    "no_speech_prob": None,
                    "seek": int(start_time),
                    "start": start_time + TIMESTAMP_SECONDS * (piece[0] - first_id),
                    "temperature": temperature,
                    "text": text,
                    "tokens": list(piece[1:-1]),
                }
            )
            last_start, logprob_sum = idx, 0.0
        else:
            logprob_sum += logprobs[idx - 1]
    return out
