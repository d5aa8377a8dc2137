"""LLaVA-1.5 and LLaVA-NeXT preprocessing against transformers' processors (what vLLM runs).

Tiny model dirs are written at test time (configs, tokenizer, processor config; no weights).
Token counts are checked against vLLM's own LlavaNextProcessingInfo.get_num_image_tokens too.
"""

from __future__ import annotations

import numpy as np
import pytest

from multimodal.processors.base import OptionError
from multimodal.processors.llava_next import num_image_tokens
from multimodal.processors.options import NoOptions
from multimodal.prompt import Placeholders, expand
from tests.support import load_processor
from tests.support.llava_models import NEXT_PINPOINTS, ODD_PINPOINTS, build_model
from tests.support.synthetic_images import IMAGES


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from transformers import AutoProcessor

    built = {}
    for kind in ("llava", "llava_pad", "llava_next"):
        path = build_model(tmp_path_factory.mktemp(kind), kind)
        built[kind] = (AutoProcessor.from_pretrained(path), load_processor(path))
    return built


def reference(hf, images, raw: bool):
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": "hi"}]
    text = hf.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
    )
    extra = {"do_rescale": False, "do_normalize": False} if raw else {}
    out = hf(text=[text], images=images, return_tensors="np", **extra)
    unexpanded = hf.tokenizer(text)["input_ids"]
    return out, unexpanded


def check(hf, ours, images, raw: bool):
    out, unexpanded = reference(hf, images, raw)
    got = ours.process([np.asarray(i) for i in images], ours.resolve({}), raw_pixels=raw)
    want, have = out["pixel_values"], got.tensors["pixel_values"]
    assert have.shape == want.shape
    # transformers leaves pixels uint8 with do_rescale/do_normalize off: what vLLM would send.
    assert have.dtype == want.dtype == (np.uint8 if raw else np.float32)
    diff = np.abs(have.astype(np.float64) - want.astype(np.float64))
    assert diff.max() <= (0 if raw else 1e-5), f"max abs diff {diff.max()}"
    if "image_sizes" in out:
        assert got.tensors["image_sizes"].dtype == out["image_sizes"].dtype
        assert np.array_equal(got.tensors["image_sizes"], out["image_sizes"])
    placeholders = Placeholders("image", ours.anchor_token_id, got.replacements)
    ids, (ranges,) = expand(unexpanded, [placeholders])
    assert ids == [int(i) for i in out["input_ids"][0]]
    assert all(ids[o : o + n] == [ours.anchor_token_id] * n for o, n in ranges)
    assert got.embed_token_id is None
    return got


@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float"])
@pytest.mark.parametrize("name", IMAGES)
@pytest.mark.parametrize("kind", ["llava", "llava_next"])
def test_one_image_matches_transformers(models, kind, name, raw):
    hf, ours = models[kind]
    got = check(hf, ours, [IMAGES[name]], raw)
    if kind == "llava":
        assert got.tensors["pixel_values"].shape == (1, 3, 336, 336)
        assert len(got.replacements[0]) == 576


@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float"])
@pytest.mark.parametrize("kind", ["llava", "llava_next"])
def test_several_mixed_images_in_one_request(models, kind, raw):
    hf, ours = models[kind]
    images = [IMAGES["tall"], IMAGES["large"], IMAGES["tiny"], IMAGES["odd"]]
    got = check(hf, ours, images, raw)
    assert got.tensors["pixel_values"].shape[0] == 4
    if kind == "llava_next":
        # Tile counts differ (3, 5, 3, 3), so the shorter ones are zero-padded to 5.
        assert got.tensors["pixel_values"].shape[1] == 5
        assert got.keep_on_cpu_keys == ("image_sizes",)
        assert got.tensors["image_sizes"].tolist() == [[400, 90], [960, 1280], [12, 10], [177, 333]]


@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float"])
def test_pad_to_square_matches_transformers(models, raw):
    hf, ours = models["llava_pad"]
    assert ours.pixels.settings.pad_to_square
    check(hf, ours, [IMAGES[n] for n in ("tall", "very thin", "odd", "square")], raw)


def test_families_are_told_apart(models):
    from types import SimpleNamespace

    from multimodal.processors.llava import LlavaProcessor
    from multimodal.processors.llava_next import LlavaNextProcessor

    assert type(models["llava"][1]) is LlavaProcessor
    assert type(models["llava_next"][1]) is LlavaNextProcessor
    clip = {"model_type": "clip_vision_model"}
    for config, pre, llava, nxt in [
        ({"model_type": "llava", "vision_config": clip}, {}, True, False),
        (
            {"model_type": "llava_next"},
            {"image_processor_type": "LlavaNextImageProcessor"},
            False,
            True,
        ),
        # Pixtral rides on model_type "llava" with its own processor; SigLIP's defaults differ.
        ({"model_type": "llava", "vision_config": {"model_type": "pixtral"}}, {}, False, False),
        ({"model_type": "llava"}, {"image_processor_type": "SiglipImageProcessor"}, False, False),
    ]:
        files = SimpleNamespace(config=config, preprocessor=pre, video_preprocessor={}, vocab={})
        assert LlavaProcessor.matches(files) == llava
        assert LlavaNextProcessor.matches(files) == nxt


def sizes_to_count():
    rng = np.random.default_rng(0)
    sizes = [
        (h, w)
        for h in (1, 2, 7, 14, 177, 335, 336, 337, 671, 672, 673, 1008)
        for w in (1, 3, 8, 333, 336, 500, 672, 1000, 1009, 4000)
    ]
    sizes += [tuple(int(x) for x in rng.integers(1, 3000, 2)) for _ in range(300)]
    # Aspect ratios right at a pinpoint's, where the branch and rounding are decided.
    sizes += [(k * 1, k * 2) for k in range(1, 400, 7)] + [(k * 3, k) for k in range(1, 400, 11)]
    return sizes


@pytest.mark.parametrize("pinpoints", [NEXT_PINPOINTS, ODD_PINPOINTS], ids=["v1.6", "odd"])
def test_next_token_count_is_vllms(tmp_path, pinpoints):
    """Our count equals vLLM's get_num_image_tokens and transformers' on many odd sizes."""
    from transformers import AutoConfig, AutoProcessor

    path = build_model(tmp_path, "llava_next", pinpoints)
    ours = load_processor(path)
    hf = AutoProcessor.from_pretrained(path)
    sizes = sizes_to_count()
    counts = [ours.num_image_tokens(h, w) for h, w in sizes]
    assert counts == [num_image_tokens(h, w, ours.tower, pinpoints) for h, w in sizes]
    hf_counts = hf._get_num_multimodal_tokens(image_sizes=sizes)["num_image_tokens"]
    assert counts == hf_counts

    llava_next = pytest.importorskip("vllm.model_executor.models.llava_next")
    # vLLM's ProcessingInfo only needs the HF config; skip the rest of its context.
    info = object.__new__(llava_next.LlavaNextProcessingInfo)
    config = AutoConfig.from_pretrained(path)
    info.get_hf_config = lambda: config
    vllm_counts = [info.get_num_image_tokens(image_width=w, image_height=h) for h, w in sizes]
    assert counts == vllm_counts


def test_llava_token_count_is_vllms(models, tmp_path):
    from transformers import AutoConfig

    _, ours = models["llava"]
    llava = pytest.importorskip("vllm.model_executor.models.llava")
    info = object.__new__(llava.LlavaProcessingInfo)
    config = AutoConfig.from_pretrained(build_model(tmp_path, "llava"))
    info.get_hf_config = lambda: config
    for h, w in [(1, 1), (336, 336), (960, 1280), (8, 600)]:
        assert ours.num_image_tokens(h, w) == info.get_num_image_tokens(
            image_width=w, image_height=h
        )


@pytest.mark.parametrize("kind", ["llava", "llava_next"])
@pytest.mark.parametrize("options", [{"do_resize": False}, {"size": {"shortest_edge": 224}}])
def test_options_are_refused(models, kind, options):
    _, ours = models[kind]
    assert ours.resolve({}) == NoOptions()
    with pytest.raises(OptionError, match="accepted: none"):
        ours.resolve(options)
