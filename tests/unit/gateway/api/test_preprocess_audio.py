"""POST /v1/preprocess's service with audio on the tiny Qwen2-Audio, down either path
`--mm-processing` picks: by default (auto) the gateway preprocesses the clips and each is
reported by its tensors, placeholder and tokens as an image is; with `worker` the workers do.
Either way each clip is labelled audio with its container, rate, channels, length and bytes,
as decoded; the media a model takes are named for the playground."""

from __future__ import annotations

import asyncio
import base64
import io
from pathlib import Path

import numpy as np
import pytest

from gateway.api.preprocess import PreprocessService
from gateway.errors import MmgateError
from gateway.render.model_files import ModelFiles
from gateway.render.prompt import PromptBuilder
from gateway.render.renderer import ChatRenderer
from gateway.render.worker_media import MmProcessing, fallback_placeholders
from multimodal.audio import load_audio
from multimodal.media import MediaPolicy
from multimodal.pipeline import PixelEncoding
from multimodal.registry import processors_for
from protos import extensions
from tests.support.qwen2_audio_models import AUDIO, AUDIO_BOS, AUDIO_EOS
from tests.unit.gateway.api.test_preprocess import facts

TAKES_AUDIO = frozenset({extensions.TAKES_AUDIO_MM_INPUTS})

PATHS = ["auto", "worker"]
# What the gateway knows of a clip whoever preprocesses it.
CLIP_FACTS = ("index", "format", "mime", "sample_rate", "channels", "seconds", "bytes")


@pytest.fixture(scope="module")
def qwen2_audio_model(tmp_path_factory) -> Path:
    from tests.support.qwen2_audio_models import build_model

    return build_model(tmp_path_factory.mktemp("qwen2-audio") / "model")


def service(model: Path, mm_processing: MmProcessing = "auto", **over) -> PreprocessService:
    """As `mmgate serve --mm-processing MODE` builds it: media without a processor here
    rendered as vLLM renders them for the worker."""
    files = ModelFiles.load(model)
    processors = processors_for(files)
    placeholders = {
        **fallback_placeholders(files.config.get("architectures") or ()),
        **processors.placeholders,
    }
    renderer = ChatRenderer(files, placeholders)
    prompts = PromptBuilder(renderer, processors, MediaPolicy(), mm_processing=mm_processing)
    # a worker as `mmgate engine` advertises itself: it takes preprocessed audio
    worker = {"mm_item_limits": {"audio": 2}, "extensions": TAKES_AUDIO}
    return PreprocessService("m", prompts, facts(**{**worker, **over}))


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


def two_clips() -> tuple[bytes, bytes, list[dict]]:
    """A 1 s mono WAV at 16 kHz and a 1.5 s stereo FLAC at 44.1 kHz, as the two kinds of part."""
    mono, stereo = clip(1.0, 16000, 1), clip(1.5, 44100, 2, "FLAC")
    parts = [
        {"type": "input_audio", "input_audio": {"data": b64(mono), "format": "wav"}},
        {"type": "audio_url", "audio_url": {"url": f"data:audio/flac;base64,{b64(stereo)}"}},
    ]
    return mono, stereo, parts


def test_clips_a_worker_preprocesses_are_labelled_audio_with_their_facts(qwen2_audio_model):
    mono, stereo, parts = two_clips()
    reply = ask(service(qwen2_audio_model, "worker"), parts)
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


def test_clips_the_gateway_preprocesses_are_reported_by_their_tensors(qwen2_audio_model):
    """By default (auto) the gateway has Qwen2-Audio's processor: per clip vLLM's tensors (a
    [128, 3000] input_features, the 30 s window, and its [3000] feature_attention_mask), the
    placeholder's range in the prompt and its ((L-1)//2+1-2)//2+1 tokens for L = the clip's
    mel frames at 16 kHz (10 ms each); floats reported in the dtype they travel in."""
    from transformers import AutoTokenizer

    mono, stereo, parts = two_clips()
    svc = service(qwen2_audio_model, pixels=PixelEncoding(raw=False, float_dtype="bfloat16"))
    reply = ask(svc, parts)
    assert reply["processed_by"] == "gateway"
    assert (reply["family"], reply["video_family"], reply["audio_family"]) == (
        None,
        None,
        "qwen2_audio",
    )
    first, second = reply["audio"]
    assert (first["format"], first["mime"], first["bytes"]) == ("wav", "audio/wav", len(mono))
    assert (first["sample_rate"], first["channels"], first["seconds"]) == (16000, 1, 1.0)
    assert (second["format"], second["bytes"]) == ("flac", len(stereo))
    assert (second["sample_rate"], second["channels"], second["seconds"]) == (44100, 2, 1.5)
    for audio, frames in ((first, 100), (second, 150)):  # 1.0 s and 1.5 s at 16 kHz
        tokens = ((frames - 1) // 2 + 1 - 2) // 2 + 1
        assert (audio["tokens"], audio["embeddings"]) == (tokens, tokens)
        assert audio["placeholder"]["length"] == tokens
        assert audio["tensors"] == {
            "input_features": {"shape": [128, 3000], "dtype": "bfloat16"},
            "feature_attention_mask": {"shape": [3000], "dtype": "int32"},
        }
        assert audio["grid"] == {}  # (the mask's 3000 values are no layout to show)
        assert len(audio["hash"]) == 64
    assert (first["tokens"], second["tokens"]) == (25, 37)
    assert first["hash"] != second["hash"]
    # the ranges are each clip's <|AUDIO|> run, between its markers, in the expanded prompt
    vocab = AutoTokenizer.from_pretrained(qwen2_audio_model).get_vocab()
    ids = svc.prompts.render(svc_request(parts)).token_ids
    assert ids.count(vocab[AUDIO]) == 2  # one per clip before expansion
    expanded = asyncio.run(svc.prompts.build(svc_request(parts), svc.facts.pixels)).ids
    assert len(expanded) == reply["prompt_tokens"] == len(ids) - 2 + 25 + 37
    for audio in (first, second):
        offset, length = audio["placeholder"]["offset"], audio["placeholder"]["length"]
        assert (
            expanded[offset - 1] == vocab[AUDIO_BOS]
            and expanded[offset + length] == vocab[AUDIO_EOS]
        )
        assert set(expanded[offset : offset + length]) == {vocab[AUDIO]}


def svc_request(parts: list[dict]):
    from gateway.api.protocol import ChatPromptFields

    content = [*parts, {"type": "text", "text": "What is this?"}]
    return ChatPromptFields(messages=[{"role": "user", "content": content}])


def test_a_clip_s_own_facts_are_the_same_down_either_path(qwen2_audio_model):
    _, _, parts = two_clips()
    gateway, worker = (ask(service(qwen2_audio_model, mode), parts) for mode in PATHS)
    assert (gateway["processed_by"], worker["processed_by"]) == ("gateway", "worker")
    assert [{k: a[k] for k in CLIP_FACTS} for a in gateway["audio"]] == [
        {k: a[k] for k in CLIP_FACTS} for a in worker["audio"]
    ]


@pytest.mark.parametrize("mode", PATHS)
@pytest.mark.parametrize(("fmt", "mime"), [("MP3", "audio/mpeg"), ("OGG", "audio/ogg")])
def test_compressed_clips_report_their_decoded_length(qwen2_audio_model, fmt, mime, mode):
    raw = clip(0.8, 48000 if fmt == "OGG" else 44100, 2, fmt)
    (audio,) = ask(
        service(qwen2_audio_model, mode),
        [{"type": "input_audio", "input_audio": {"data": b64(raw), "format": "wav"}}],
    )["audio"]
    assert (audio["mime"], audio["channels"], audio["bytes"]) == (mime, 2, len(raw))
    decoded = load_audio(f"data:{mime};base64,{b64(raw)}", None, MediaPolicy()).audio
    # (an MP3's encoder adds padding: the length is the decoded one, not the written 0.8 s)
    assert audio["seconds"] == round(decoded.samples.shape[-1] / decoded.sample_rate, 3)
    assert audio["sample_rate"] == decoded.sample_rate


@pytest.mark.parametrize("mode", PATHS)
def test_bad_audio_is_refused_naming_the_clip(qwen2_audio_model, mode):
    part = {"type": "input_audio", "input_audio": {"data": b64(b"no audio" * 20), "format": "wav"}}
    with pytest.raises(MmgateError) as refused:
        ask(service(qwen2_audio_model, mode), [part])
    assert refused.value.status == 400 and "audio 0: not a supported audio format" in str(
        refused.value.message
    )


def test_the_media_a_model_takes_are_named(qwen2_audio_model, vision_model):
    # the worker fallback renders an image part for any architecture: Qwen2-Audio takes none
    assert ask(service(qwen2_audio_model), [])["modalities"] == ["audio"]
    assert ask(service(vision_model), [])["modalities"] == ["image", "video"]
    assert ask(service(vision_model, supports_vision=False), [])["modalities"] == []


@pytest.fixture(scope="module")
def omni_model(tmp_path_factory) -> Path:
    from tests.support.qwen25_omni_models import build_model

    return build_model(tmp_path_factory.mktemp("qwen25-omni") / "model")


def test_omni_clips_are_reported_by_their_frames(omni_model):
    """Qwen2.5-Omni's features travel as each clip's real frames, [L, 128], with L among its
    layout (its `audio_feature_lengths`), its mask padded to the extractor's 300 s window."""
    mono, stereo, parts = two_clips()
    reply = ask(service(omni_model), parts)
    assert (reply["processed_by"], reply["audio_family"]) == ("gateway", "qwen25_omni_audio")
    for audio, frames in zip(reply["audio"], (100, 150)):
        tokens = ((frames - 1) // 2 + 1 - 2) // 2 + 1
        assert (audio["tokens"], audio["placeholder"]["length"]) == (tokens, tokens)
        assert audio["tensors"] == {
            "input_audio_features": {"shape": [frames, 128], "dtype": "float32"},
            "feature_attention_mask": {"shape": [30000], "dtype": "int32"},
            "audio_feature_lengths": {"shape": [], "dtype": "int64"},
        }
        assert audio["grid"] == {"audio_feature_lengths": frames}
    assert [a["bytes"] for a in reply["audio"]] == [len(mono), len(stereo)]


def test_auto_leaves_audio_to_workers_that_take_no_preprocessed_audio(qwen2_audio_model):
    """Auto decides as chat does: a worker without the `audio_mm_inputs` capability (SMG's
    servicer) gets the clips to preprocess itself, even where the gateway could."""
    part = {
        "type": "input_audio",
        "input_audio": {"data": b64(clip(1.0, 16000, 1)), "format": "wav"},
    }
    assert ask(service(qwen2_audio_model), [part])["processed_by"] == "gateway"
    servicer = service(qwen2_audio_model, extensions=frozenset())
    assert ask(servicer, [part])["processed_by"] == "worker"
