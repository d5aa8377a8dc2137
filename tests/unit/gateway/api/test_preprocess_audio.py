"""POST /v1/preprocess's service with audio: on the tiny Qwen2-Audio each clip is labelled audio
with its container, rate, channels, length and bytes, as decoded, whether its workers preprocess
it (facts without the `audio_mm_inputs` capability, as SMG's servicer's) or the gateway does; a
clip the gateway preprocesses is reported by its tensors as an image is; the media a model takes
are named for the playground."""

from __future__ import annotations

import asyncio
import base64
import io
from pathlib import Path

import numpy as np
import pytest

from gateway.api.preprocess import PreprocessService, _preprocessed
from gateway.errors import MmgateError
from gateway.render.model_files import ModelFiles
from gateway.render.prompt import Prompt, PromptBuilder
from gateway.render.renderer import ChatRenderer
from gateway.render.worker_media import fallback_placeholders
from multimodal.audio import load_audio
from multimodal.media import MediaPolicy
from multimodal.pipeline import Prepared, PreparedItems
from multimodal.processors.base import ProcessedItems
from multimodal.registry import processors_for
from protos import extensions
from tests.unit.gateway.api.test_preprocess import facts


@pytest.fixture(scope="module")
def qwen2_audio_model(tmp_path_factory) -> Path:
    from tests.support.qwen2_audio_models import build_model

    return build_model(tmp_path_factory.mktemp("qwen2-audio") / "model")


def service(model: Path, **over) -> PreprocessService:
    """As `mmgate serve` builds it: media without a processor here rendered as vLLM renders
    them for the worker."""
    files = ModelFiles.load(model)
    processors = processors_for(files)
    placeholders = {
        **fallback_placeholders(files.config.get("architectures") or ()),
        **processors.placeholders,
    }
    prompts = PromptBuilder(ChatRenderer(files, placeholders), processors, MediaPolicy())
    return PreprocessService("m", prompts, facts(**{"mm_item_limits": {"audio": 2}, **over}))


def clip(seconds: float, rate: int, channels: int, fmt: str = "WAV") -> bytes:
    import soundfile

    t = np.arange(round(seconds * rate)) / rate
    samples = np.stack([0.3 * np.sin(2 * np.pi * (220 + 110 * k) * t) for k in range(channels)])
    buffer = io.BytesIO()
    subtype = {"MP3": "MPEG_LAYER_III", "OGG": "OPUS"}.get(fmt)
    soundfile.write(buffer, samples.T.astype(np.float32), rate, format=fmt, subtype=subtype)
    return buffer.getvalue()


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def ask(svc: PreprocessService, parts: list[dict]) -> dict:
    content = [*parts, {"type": "text", "text": "What is this?"}]
    return asyncio.run(svc.preprocess({"messages": [{"role": "user", "content": content}]}))


def test_clips_a_worker_preprocesses_are_labelled_audio_with_their_facts(qwen2_audio_model):
    mono, stereo = clip(1.0, 16000, 1), clip(1.5, 44100, 2, "FLAC")
    parts = [
        {"type": "input_audio", "input_audio": {"data": b64(mono), "format": "wav"}},
        {"type": "audio_url", "audio_url": {"url": f"data:audio/flac;base64,{b64(stereo)}"}},
    ]
    reply = ask(service(qwen2_audio_model), parts)
    assert reply["processed_by"] == "worker"
    assert reply["images"] == [] and reply["videos"] == []
    assert (reply["family"], reply["video_family"], reply["audio_family"]) == (None, None, None)
    first, second = reply["audio"]
    assert first["index"] == 0 and second["index"] == 1
    assert (first["format"], first["mime"], first["bytes"]) == ("wav", "audio/wav", len(mono))
    assert (first["sample_rate"], first["channels"], first["seconds"]) == (16000, 1, 1.0)
    assert (second["format"], second["bytes"]) == ("flac", len(stereo))
    assert (second["sample_rate"], second["channels"], second["seconds"]) == (44100, 2, 1.5)
    # the worker expands the placeholders: nothing of the model's is known here
    assert first["tensors"] == {} and first["tokens"] is None and first["placeholder"] is None


def test_clips_the_gateway_preprocesses_are_reported_with_their_tensors(qwen2_audio_model):
    """With workers that take preprocessed audio (mmgate's engine advertises it), the gateway
    preprocesses Qwen2-Audio's clips itself; without (the facts above: SMG's servicer), the
    worker does, as chat decides it."""
    mono = clip(1.0, 16000, 1)
    part = {"type": "input_audio", "input_audio": {"data": b64(mono), "format": "wav"}}
    ours = service(qwen2_audio_model, extensions=frozenset({extensions.TAKES_AUDIO_MM_INPUTS}))
    reply = ask(ours, [part])
    assert (reply["processed_by"], reply["audio_family"]) == ("gateway", "qwen2_audio")
    (audio,) = reply["audio"]
    assert (audio["format"], audio["mime"], audio["bytes"]) == ("wav", "audio/wav", len(mono))
    assert (audio["sample_rate"], audio["channels"], audio["seconds"]) == (16000, 1, 1.0)
    assert audio["tokens"] == 25  # ((L-1)//2+1-2)//2+1 for L = 100 mel frames
    assert audio["tensors"]["input_features"]["shape"] == [128, 3000]
    assert ask(service(qwen2_audio_model), [part])["processed_by"] == "worker"


@pytest.mark.parametrize(("fmt", "mime"), [("MP3", "audio/mpeg"), ("OGG", "audio/ogg")])
def test_compressed_clips_report_their_decoded_length(qwen2_audio_model, fmt, mime):
    raw = clip(0.8, 48000 if fmt == "OGG" else 44100, 2, fmt)
    (audio,) = ask(
        service(qwen2_audio_model),
        [{"type": "input_audio", "input_audio": {"data": b64(raw), "format": "wav"}}],
    )["audio"]
    assert (audio["mime"], audio["channels"], audio["bytes"]) == (mime, 2, len(raw))
    decoded = load_audio(f"data:{mime};base64,{b64(raw)}", None, MediaPolicy()).audio
    # (an MP3's encoder adds padding: the length is the decoded one, not the written 0.8 s)
    assert audio["seconds"] == round(decoded.samples.shape[-1] / decoded.sample_rate, 3)
    assert audio["sample_rate"] == decoded.sample_rate


def test_bad_audio_is_refused_naming_the_clip(qwen2_audio_model):
    part = {"type": "input_audio", "input_audio": {"data": b64(b"no audio" * 20), "format": "wav"}}
    with pytest.raises(MmgateError) as refused:
        ask(service(qwen2_audio_model), [part])
    assert refused.value.status == 400 and "audio 0: not a supported audio format" in str(
        refused.value.message
    )


def test_the_media_a_model_takes_are_named(qwen2_audio_model, vision_model):
    # the worker fallback renders an image part for any architecture: Qwen2-Audio takes none
    assert ask(service(qwen2_audio_model), [])["modalities"] == ["audio"]
    assert ask(service(vision_model), [])["modalities"] == ["image", "video"]
    assert ask(service(vision_model, supports_vision=False), [])["modalities"] == []


def test_a_clip_the_gateway_preprocesses_is_reported_by_its_tensors(qwen2_audio_model):
    """The report reads whatever tensors the audio processor makes (Qwen2-Audio's, as vLLM lays
    them out: per clip a [128, 3000] input_features and a [3000] feature_attention_mask);
    built here by hand, as no audio processor is in the gateway yet."""
    sources = [f"data:audio/wav;base64,{b64(clip(s, 16000, 1))}" for s in (1.0, 2.0)]
    items = [load_audio(source, None, MediaPolicy()) for source in sources]
    tokens = [25, 50]  # ((L-1)//2+1-2)//2+1 for L = 100 and 200 mel frames
    mask = np.zeros((2, 3000), dtype=np.int64)
    mask[0, :100], mask[1, :200] = 1, 1
    processed = ProcessedItems(
        tensors={
            "input_features": np.zeros((2, 128, 3000), dtype=np.float32),
            "feature_attention_mask": mask,
            "audio_embed_lens": np.array(tokens),
        },
        batched_keys=("input_features", "feature_attention_mask", "audio_embed_lens"),
        embed_token_id=7,
    )
    ids = [1] * 3 + [7] * tokens[0] + [1] * 4 + [7] * tokens[1] + [1]
    ranges = [(3, tokens[0]), (3 + tokens[0] + 4, tokens[1])]
    part = PreparedItems("audio", processed, ranges, ["a" * 64, "b" * 64])
    prompt = Prompt(ids, "", Prepared(ids, [part], "bfloat16"), items=items)
    first, second = _preprocessed(prompt)["audio"]
    assert (first.seconds, second.seconds, first.format, first.channels) == (1.0, 2.0, "wav", 1)
    assert first.tensors["input_features"].shape == [128, 3000]
    assert first.tensors["input_features"].dtype == "bfloat16"  # as floats travel
    assert first.tensors["feature_attention_mask"].dtype == "int64"
    assert (first.tokens, first.embeddings, second.tokens) == (25, 25, 50)
    assert second.placeholder.offset == ranges[1][0]
    # the small integer tensors are its layout; the mask (3000 values) is not
    assert (first.grid, second.grid) == ({"audio_embed_lens": 25}, {"audio_embed_lens": 50})
    assert second.hash == "b" * 64
