"""Per-item shares of every registered family's batches (`multimodal.processors.items`): a
batch cut into shares joins back byte for byte, and items processed one at a time (as the
media cache stores them) join into exactly the batch processing them together gives."""

from __future__ import annotations

import numpy as np
import pytest

from multimodal.audio_decode import DecodedAudio
from multimodal.errors import MmgateError
from multimodal.processors.items import join_items, split_items
from multimodal.registry import FAMILIES
from multimodal.video_decode import DecodedClip
from tests.support import load_processor


def _builders():
    from tests.support import (
        gemma3_models,
        gemma4_models,
        glm4v_models,
        idefics3_models,
        internvl_models,
        kimi_k25_models,
        llama4_models,
        llava_models,
        llava_onevision_models,
        pixtral_models,
        qwen2_audio_models,
        qwen25_omni_models,
        qwen35_models,
    )

    return {
        "qwen2_vl": lambda d, vision: vision,
        "qwen3_5": lambda d, _: qwen35_models.build_model(d, weights=False),
        "llava": lambda d, _: llava_models.build_model(d, "llava"),
        "llava_next": lambda d, _: llava_models.build_model(d, "llava_next"),
        "llava_onevision": lambda d, _: llava_onevision_models.build_model(d, weights=False),
        "llama4": lambda d, _: llama4_models.build_model(d, weights=False),
        "mistral3": lambda d, _: pixtral_models.build_model(d, False, "mistral3"),
        "pixtral": lambda d, _: pixtral_models.build_model(d, False, "pixtral"),
        "gemma3": lambda d, _: gemma3_models.build_model(d, weights=False),
        "gemma4": lambda d, _: gemma4_models.build_model(d, weights=False),
        "idefics3": lambda d, _: idefics3_models.build_model(d, weights=False),
        "smolvlm": lambda d, _: idefics3_models.build_model(
            d, weights=False, variant=idefics3_models.SMOLVLM
        ),
        "internvl": lambda d, _: internvl_models.build_model(d, weights=False),
        "glm4v": lambda d, _: glm4v_models.build_model(d, "glm4v", weights=False),
        "kimi_k25": lambda d, _: kimi_k25_models.build_model(d, weights=False),
        "qwen2_audio": lambda d, _: qwen2_audio_models.build_model(d),
        "qwen25_omni": lambda d, _: qwen25_omni_models.build_model(d),
    }


@pytest.fixture(scope="module")
def processors(tmp_path_factory, vision_model):
    """Every registered family's processor, keyed by its class."""
    found = {}
    for name, build in _builders().items():
        path = build(tmp_path_factory.mktemp(name) / "model", vision_model)
        for modality in ("image", "video", "audio"):
            try:
                processor = load_processor(path, modality)
            except Exception:  # the model has no processor of this modality
                continue
            found.setdefault(type(processor), processor)
    return found


def test_every_registered_family_is_covered(processors):
    assert set(FAMILIES) <= set(processors), set(FAMILIES) - set(processors)


def _image(seed: int, height: int, width: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def _clip(seed: int, frames: int, height: int = 56, width: int = 84) -> DecodedClip:
    pixels = np.random.default_rng(seed).integers(0, 256, (frames, height, width, 3), np.uint8)
    return DecodedClip(pixels, list(range(frames)), frames, 2.0)


def _audio(seed: int, seconds: float, rate: int, channels: int) -> DecodedAudio:
    samples = np.random.default_rng(seed).uniform(-0.5, 0.5, (channels, round(seconds * rate)))
    return DecodedAudio(samples.astype(np.float32), rate, "soundfile")


def _items(processor, frame_counts=(4, 6)) -> list:
    if processor.modality == "audio":  # lengths that give different frame counts and tokens
        return [_audio(1, 1.5, 16000, 1), _audio(2, 0.3, 24000, 2), _audio(3, 31, 16000, 1)]
    if type(processor).__name__ == "Glm4vVideoProcessor":  # takes one video per prompt
        return [_clip(0, frame_counts[0])]
    if processor.modality == "video":
        return [_clip(k, n) for k, n in enumerate((*frame_counts, frame_counts[0]))]
    # sizes that give different grids, tile counts and (Pixtral) a ragged batch
    return [_image(1, 60, 90), _image(2, 200, 120), _image(3, 33, 47)]


def assert_same(have, want) -> None:
    assert list(have.tensors) == list(want.tensors)
    for key, tensor in want.tensors.items():
        got = have.tensors[key]
        assert (got.dtype, got.shape) == (tensor.dtype, tensor.shape), key
        assert got.tobytes() == tensor.tobytes(), key
    assert have.batched_keys == want.batched_keys
    assert have.flat_keys == want.flat_keys
    assert have.keep_on_cpu_keys == want.keep_on_cpu_keys
    assert have.replacements == want.replacements
    assert have.embed_token_id == want.embed_token_id
    assert have.encoder_key == want.encoder_key


def _cases(processors):
    for cls, processor in processors.items():
        counts = [(4, 4)] if cls.__name__ == "LlavaOnevisionVideoProcessor" else [(4, 6), (4, 4)]
        for frames in counts if processor.modality == "video" else [()]:
            for raw in (True, False):
                yield cls.__name__, processor, _items(processor, *([frames] if frames else [])), raw


def test_a_split_batch_joins_back_byte_for_byte(processors):
    seen = set()
    for name, processor, items, raw in _cases(processors):
        batch = processor.process(items, processor.defaults, raw)
        assert_same(processor.join(split_items(batch)), batch)
        seen.add(name)
    assert len(seen) == len(FAMILIES)


def test_items_processed_apart_join_into_the_batch(processors):
    """What the cache does: some items from earlier requests, some fresh, joined in order."""
    for _, processor, items, raw in _cases(processors):
        settings = processor.defaults
        batch = processor.process(items, settings, raw)
        apart = [split_items(processor.process([item], settings, raw))[0] for item in items]
        assert_same(processor.join(apart), batch)
        # a cached item joins alone without copying its tensors
        one = processor.join(apart[:1])
        assert_same(one, processor.process(items[:1], settings, raw))


def test_onevision_refuses_cached_clips_of_other_lengths(processors):
    processor = next(p for c, p in processors.items() if c.__name__.startswith("LlavaOnevisionV"))
    settings = processor.defaults
    apart = [
        split_items(processor.process([_clip(k, n)], settings, True))[0]
        for k, n in enumerate((4, 6))
    ]
    with pytest.raises(MmgateError, match="same number of frames"):
        processor.join(apart)


def test_glm4v_refuses_a_cached_clip_next_to_another(processors):
    processor = next(p for c, p in processors.items() if c.__name__ == "Glm4vVideoProcessor")
    share = split_items(processor.process([_clip(0, 4)], processor.defaults, True))[0]
    with pytest.raises(MmgateError, match="At most 1 video"):
        processor.join([share, share])


def test_shares_are_read_only_copies(processors):
    processor = next(iter(processors.values()))
    batch = processor.process(_items(processor), processor.defaults, True)
    shares = split_items(batch)
    for share in shares:
        for tensor in share.tensors.values():
            assert not tensor.flags.writeable
            assert not np.shares_memory(tensor, batch.tensors["pixel_values"])
    assert shares[0].nbytes > sum(t.nbytes for t in shares[0].tensors.values())


def test_join_refuses_items_of_different_layouts():
    from multimodal.processors.items import ItemShare

    a = ItemShare({"x": np.zeros(2)}, {"x": "flat"}, [1])
    b = ItemShare({"x": np.zeros(2)}, {"x": "batched"}, [1])
    with pytest.raises(ValueError, match="different layouts"):
        join_items([a, b])


def test_shares_of_a_lone_item_view_its_arrays_unless_they_pin_more(processors):
    processor = next(iter(processors.values()))
    batch = processor.process(_items(processor)[:1], processor.defaults, True)
    (share,) = split_items(batch, copy=False)
    pixels = share.tensors["pixel_values"]
    assert np.shares_memory(pixels, batch.tensors["pixel_values"]) and not pixels.flags.writeable
    assert batch.tensors["pixel_values"].flags.writeable  # the processor's array is untouched
    block = np.zeros(4 * pixels.size, pixels.dtype)  # a pooled output: a view of a larger block
    carved = block[: pixels.size].reshape(pixels.shape)
    carved[...] = pixels
    batch.tensors["pixel_values"] = carved
    (share,) = split_items(batch, copy=False)
    assert not np.shares_memory(share.tensors["pixel_values"], block)
    assert share.tensors["pixel_values"].tobytes() == pixels.tobytes()
