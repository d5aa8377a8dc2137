"""Qwen2-Audio and Qwen2.5-Omni clips made by the gateway equal vLLM's own, end to end short of
the model: the gateway decodes, resamples and extracts features (`multimodal.pipeline`), the
engine lays the wire's tensors out (`engine_server.mm_inputs`), and the items the engine would
hand AsyncLLM are compared with the items vLLM's own processor makes from the same chat
(`tests.support.vllm_audio`): the same expanded prompt ids and ranges, the same keys, field
kinds, axes and CPU placement, integer tensors exact, features within ATOL.

Clips: 0.2 s to past 30 s, at 16, 24 and 44.1 kHz, mono and stereo, WAV and FLAC, alone, two
per prompt and (Omni) after an image; tiny random-weight models, vLLM in float32.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import pytest

from tests.support.audio_refs import require

# The features' error is the extractor's (tests/unit/multimodal/test_audio_features.py: float64
# here, float32 torch there, at most 2.4e-5 measured) plus what the resampler's last-bit
# differences (<= 3e-7 per sample) move: measured at most 2.1e-5 on these clips.
ATOL = 5e-5
# name -> (seconds, rate, channels, soundfile format)
CLIPS = {
    "0.2s-16k": (0.2, 16000, 1, "WAV"),
    "5s-24k-stereo": (5.0, 24000, 2, "WAV"),
    "31s-44.1k": (31.0, 44100, 1, "WAV"),
    "5s-44.1k-stereo-flac": (5.0, 44100, 2, "FLAC"),
}
FAMILIES = ["qwen2_audio", "qwen25_omni"]
# The Qwen-VL image family's per-item patch counts: its wire's sizes tensor, which the engine
# keeps in the item (the model reads only the tensors it knows); vLLM's items have none.
WIRE_ONLY = {"patches_per_image"}
# vLLM's ModelConfig for the reference (float32: the features compared at full precision).
_CONFIG = {"dtype": "float32", "max_model_len": 2048}


def clip_bytes(seconds: float, rate: int, channels: int, fmt: str, seed: int) -> bytes:
    """A tone under noise per channel (each its own), as 16-bit PCM in `fmt`."""
    soundfile = require("soundfile")
    rng = np.random.default_rng(seed)
    t = np.arange(round(seconds * rate)) / rate
    signal = np.stack(
        [
            0.3 * np.sin(2 * np.pi * (330 + 110 * c) * t) + 0.05 * rng.standard_normal(t.size)
            for c in range(channels)
        ],
        axis=1,
    )
    out = io.BytesIO()
    soundfile.write(out, np.clip(signal, -1, 1), rate, format=fmt, subtype="PCM_16")
    return out.getvalue()


@pytest.fixture(scope="module")
def clips() -> dict[str, str]:
    mime = {"WAV": "audio/wav", "FLAC": "audio/flac"}
    return {
        name: f"data:{mime[fmt]};base64,"
        + base64.b64encode(clip_bytes(seconds, rate, channels, fmt, seed)).decode()
        for seed, (name, (seconds, rate, channels, fmt)) in enumerate(CLIPS.items())
    }


@pytest.fixture(scope="module")
def image_uri() -> str:
    from tests.support.synthetic_images import image

    out = io.BytesIO()
    image(90, 62, seed=3).save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


@pytest.fixture(scope="module", params=FAMILIES)
def model(request, tmp_path_factory) -> Path:
    from tests.support import qwen2_audio_models, qwen25_omni_models

    build = {
        "qwen2_audio": qwen2_audio_models.build_model,
        "qwen25_omni": qwen25_omni_models.build_model,
    }[request.param]
    return build(tmp_path_factory.mktemp(request.param) / "model")


def reference(model: Path, audios: list[str], images: list[str] = ()) -> dict:
    from PIL import Image

    from tests.support.vllm_audio import vllm_audio_inputs

    pil = [
        Image.open(io.BytesIO(base64.b64decode(u.split(",", 1)[1]))).convert("RGB") for u in images
    ]
    return vllm_audio_inputs(model, audios, pil, **_CONFIG)


def ours(model: Path, rendered_ids: list[int], audios: list[str], images: list[str] = ()):
    """The gateway's prepared items for the template's ids (images first, as rendered), and
    the engine's prompt built from their wire messages."""
    import torch

    from engine_server.mm_inputs import PixelContract, build_mm_prompt, model_flat_dims
    from gateway.render.model_files import ModelFiles
    from multimodal.media import MediaPolicy
    from multimodal.pipeline import PixelEncoding, decode_items, prepare
    from multimodal.registry import processors_for
    from tests.support.vllm_video import _setup

    processors = processors_for(ModelFiles.load(model))
    policy, groups = MediaPolicy(), []
    for modality, uris in (("image", images), ("audio", audios)):
        if uris:
            processor = processors.get(modality)
            items = decode_items(processor, uris, [None] * len(uris), processor.defaults, policy)
            groups.append((processor, items))
    prepared = prepare(groups, rendered_ids, {}, PixelEncoding(raw=False))
    vllm_processor = _setup(model, _CONFIG)[0]
    engine = build_mm_prompt(
        prepared.prompt_ids,
        prepared.mm_inputs,
        PixelContract(device_normalizes=False, model_dtype=torch.float32),
        flat_dims=model_flat_dims(vllm_processor),
    )
    return prepared, engine


def assert_same(model: Path, audios: list[str], images: list[str] = ()) -> float:
    """The comparison; returns the largest feature difference."""
    ref = reference(model, audios, images)
    prepared, engine = ours(model, ref["rendered_ids"], audios, images)
    assert prepared.prompt_ids == ref["prompt_token_ids"]
    ranges = {p.modality: p.ranges for p in prepared.parts}
    assert ranges == ref["ranges"]
    worst = 0.0
    for modality, items in engine["mm_kwargs"].items():
        assert len(items) == len(ref[modality])
        for item, expected in zip(items, ref[modality]):
            assert set(item) - WIRE_ONLY == set(expected), modality
            for key, element in item.items():
                if key in WIRE_ONLY:
                    continue
                field = element.field
                kind = (type(field).__name__, getattr(field, "dim", None), field.keep_on_cpu)
                assert kind == ref["fields"][modality][key], key
                got, want = element.data.numpy(), expected[key]
                assert got.dtype == want.dtype and got.shape == want.shape, key
                if np.issubdtype(want.dtype, np.floating) and modality == "audio":
                    diff = float(np.abs(got - want).max()) if want.size else 0.0
                    assert diff <= ATOL, (key, diff)
                    worst = max(worst, diff)
                else:
                    np.testing.assert_array_equal(got, want, err_msg=key)
    return worst


@pytest.mark.parametrize("clip", sorted(CLIPS))
def test_one_clip(model, clips, clip):
    assert_same(model, [clips[clip]])


def test_two_clips(model, clips):
    """Two clips of different lengths and rates in one prompt: each processed alone."""
    assert_same(model, [clips["31s-44.1k"], clips["0.2s-16k"]])


def test_image_beside_a_clip(model, clips, image_uri):
    """Omni takes an image beside a clip, as vLLM does; Qwen2-Audio takes none, in the
    gateway's registry as in vLLM's processor."""
    if "omni" in str(model):
        assert_same(model, [clips["5s-24k-stereo"]], [image_uri])
        return
    from gateway.render.model_files import ModelFiles
    from multimodal.registry import processors_for
    from tests.support.vllm_video import _setup

    assert set(processors_for(ModelFiles.load(model)).by_modality) == {"audio"}
    assert "image" not in _setup(model, _CONFIG)[0].info.get_supported_mm_limits()


def test_token_counts(model, clips):
    """The issue's counts: a 31 s clip is 750 tokens for Qwen2-Audio (cut at 30 s) and 775
    for Omni (padded to 300 s, not cut); 0.2 s is 5 for both."""
    ref = reference(model, [clips["31s-44.1k"], clips["0.2s-16k"]])
    long = 775 if "omni" in str(model) else 750
    assert [length for _, length in ref["ranges"]["audio"]] == [long, 5]


def test_too_short_clip_is_refused(model):
    """Under 3 feature frames (20 ms) there is no audio token: a 400 naming the clip, as vLLM
    refuses it."""
    from gateway.render.model_files import ModelFiles
    from multimodal.errors import MediaError
    from multimodal.media import MediaPolicy
    from multimodal.pipeline import PixelEncoding, decode_items, prepare
    from multimodal.registry import processors_for

    tiny = base64.b64encode(clip_bytes(0.01, 16000, 1, "WAV", 0)).decode()
    uris = [f"data:audio/wav;base64,{tiny}"]
    processor = processors_for(ModelFiles.load(model)).get("audio")
    items = decode_items(processor, uris, [None], processor.defaults, MediaPolicy())
    with pytest.raises(MediaError, match="audio 0: .*too short") as caught:
        prepare([(processor, items)], [processor.anchor_token_id], {}, PixelEncoding(raw=False))
    assert caught.value.status == 400
