"""gateway.api.audio.whisper writes Whisper's decoder prompts and cuts verbose_json segments as
vLLM 0.32 does: the prompt text is `WhisperForConditionalGeneration.get_generation_prompt`'s
(timestamps as its server turns them on), the ids its renderer's, and the segments those of
the speech-to-text server's own `_get_verbose_segments`, run on the same tokens."""

from __future__ import annotations

import types

import numpy as np
import pytest

from gateway.api.audio import whisper
from gateway.errors import GatewayError
from tests.support import whisper_models
from tests.support.audio_refs import require


@pytest.fixture(scope="module")
def hf_tokenizer():
    return whisper_models.tokenizer()


@pytest.fixture(scope="module")
def vllm_whisper():
    return require("vllm.model_executor.models.whisper").WhisperForConditionalGeneration


def _vllm_decoder_text(vllm_whisper, language: str, task: str, prompt: str) -> str:
    from vllm.config.speech_to_text import SpeechToTextConfig, SpeechToTextParams

    params = SpeechToTextParams(
        audio=np.zeros(16000, dtype=np.float32),
        stt_config=SpeechToTextConfig(),
        model_config=None,  # type: ignore[arg-type] - Whisper's prompt does not read it
        language=language,
        task_type=task,
        request_prompt=prompt,
    )
    return vllm_whisper.get_generation_prompt(params)["decoder_prompt"]["prompt"]


@pytest.mark.parametrize(
    ("language", "task", "prompt"),
    [("en", "transcribe", ""), ("de", "translate", ""), ("fr", "transcribe", "Bonjour, le monde")],
)
def test_decoder_prompt_equals_vllm(vllm_whisper, hf_tokenizer, language, task, prompt) -> None:
    text = whisper.decoder_text(language, task, prompt, timestamps=False)
    assert text == _vllm_decoder_text(vllm_whisper, language, task, prompt)
    start = hf_tokenizer.convert_tokens_to_ids(whisper.START_OF_TRANSCRIPT)
    ids = whisper.decoder_ids(hf_tokenizer.backend_tokenizer, text, start)
    # vLLM's renderer: the text without special tokens, the start token put first if missing
    # (with a prompt the ids begin with `<|prev|>`'s pieces, so it is there twice).
    expected = hf_tokenizer.encode(text, add_special_tokens=False)
    expected = expected if expected[0] == start else [start, *expected]
    assert ids == expected
    assert ids.count(start) == (2 if prompt else 1)


def test_verbose_prompt_asks_for_timestamps() -> None:
    text = whisper.decoder_text("en", "transcribe", "<|notimestamps|> x", timestamps=True)
    assert text == "<|prev|><|0.00|> x<|startoftranscript|><|en|><|transcribe|><|0.00|>"


def test_languages_as_vllm_checks_them(vllm_whisper) -> None:
    assert tuple(vllm_whisper.supported_languages) == whisper.SUPPORTED_LANGUAGES
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    assert set(LANGUAGES) - set(whisper.SUPPORTED_LANGUAGES) == whisper.OTHER_LANGUAGES
    for code in ("en", "haw", None):
        whisper.check_language(code)
        assert vllm_whisper.validate_language(code) == code
    with pytest.raises(GatewayError) as refused:
        whisper.check_language("xx")
    with pytest.raises(ValueError) as theirs:
        vllm_whisper.validate_language("xx")
    assert refused.value.message == str(theirs.value)
    assert (whisper.separator("ja"), whisper.separator("en"), whisper.separator(None)) == (
        "",
        " ",
        " ",
    )


def test_language_tokens(hf_tokenizer, vllm_whisper) -> None:
    ids = whisper.language_token_ids(hf_tokenizer.backend_tokenizer)
    assert ids == vllm_whisper.get_language_token_ids(hf_tokenizer)
    assert whisper.detected_language(hf_tokenizer.backend_tokenizer, ids[13]) == "en"


def _vllm_segments(hf_tokenizer, tokens, logprobs, start_time, temperature):
    serving = require("vllm.entrypoints.speech_to_text.base.serving")
    from vllm.entrypoints.speech_to_text.transcription.protocol import TranscriptionSegment
    from vllm.logprobs import Logprob

    holder = types.SimpleNamespace(tokenizer=hf_tokenizer)
    positions = [{t: Logprob(logprob=v)} for t, v in zip(tokens, logprobs, strict=True)]
    request = types.SimpleNamespace(temperature=temperature)
    segments = serving.SpeechToTextBaseServing._get_verbose_segments(
        holder, tuple(tokens), positions, request, TranscriptionSegment, start_time
    )
    return [s.model_dump() for s in segments]


@pytest.mark.parametrize("seed", range(6))
def test_segments_equal_vllm(hf_tokenizer, seed: int) -> None:
    rng = np.random.default_rng(seed)
    first = hf_tokenizer.convert_tokens_to_ids(whisper.FIRST_TIMESTAMP)
    eos = hf_tokenizer.eos_token_id
    # Text pieces between rising timestamp pairs, sometimes one lone closing timestamp, EOS.
    tokens, stamp = [], 0
    for _ in range(int(rng.integers(1, 5))):
        tokens += [int(t) for t in rng.integers(100, 2000, size=int(rng.integers(1, 6)))]
        stamp += int(rng.integers(1, 200))
        tokens += [first + stamp] if rng.random() < 0.3 else [first + stamp, first + stamp]
    if seed % 2:
        tokens.append(eos)
    logprobs = [float(v) for v in -rng.random(len(tokens))]
    start_time = 29.37 * (seed % 3)
    expected = _vllm_segments(hf_tokenizer, tokens, logprobs, start_time, 0.2)
    ours = whisper.segments(
        hf_tokenizer.backend_tokenizer, tokens, logprobs, eos, start_time, 0.2, first
    )
    assert ours == expected
    assert expected  # the case cuts at least one segment
