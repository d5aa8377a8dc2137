"""Gemma 4 preprocessing against transformers' Gemma4Processor (its Gemma4ImageProcessor runs on
the torchvision backend, the default in transformers 5, which vLLM runs) and against vLLM's own
Gemma4MultiModalProcessor, run offline on the same model dir (no engine).

The model dir is the tiny Gemma 4 of tests/support/gemma4_models.py without weights (the
released image-processor settings: 280 soft tokens, 16 px patches pooled 3x3, rescale only).
Pixels: uint8 identical with rescale and normalize off, float32 within 1e-5 (in practice
identical); patch positions identical. Token ids: our expansion equals transformers'
input_ids and vLLM's prompt ids, placeholder ranges equal vLLM's.
"""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import numpy as np
import pytest

from multimodal.decode import decode_pixels
from multimodal.pipeline import PixelEncoding, prepare
from multimodal.policy import MediaPolicy
from multimodal.processors.base import ModelConfigError, OptionError
from multimodal.processors.gemma4 import (
    SUPPORTED_SOFT_TOKENS,
    Gemma4Processor,
    Gemma4Settings,
    target_size,
)
from multimodal.prompt import Placeholders, expand
from tests.support import IMAGES_DIR, load_processor
from tests.support.gemma4_models import BOI, EOI, IMAGE, SOFT_TOKENS, build_model
from tests.support.synthetic_images import IMAGES

COMMITTED = sorted(IMAGES_DIR.glob("*.[jp][pn]g"))
MIXED = ["tall", "large", "tiny", "odd", "very thin"]
# Every budget, at the top level and nested as vLLM also reads it.
OPTIONS = [{}] + [{"max_soft_tokens": n} for n in SUPPORTED_SOFT_TOKENS]
OPTIONS += [{"images_kwargs": {"max_soft_tokens": 140}}]


def option_id(options: dict) -> str:
    return json.dumps(options, separators=(",", ":")) if options else "default"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("gemma4") / "model", weights=False)


@pytest.fixture(scope="module")
def hf(model):
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(model)
    # The torchvision backend (transformers 5's default), which vLLM runs.
    assert type(processor.image_processor).__name__ == "Gemma4ImageProcessor"
    assert processor.image_processor.__class__.__mro__[1].__name__ == "TorchvisionBackend"
    return processor


@pytest.fixture(scope="module")
def ours(model) -> Gemma4Processor:
    return load_processor(model)


@pytest.fixture(scope="module")
def vllm_processor(model):
    """vLLM's Gemma4MultiModalProcessor on the model dir (float32, as the e2e engines run)."""
    from vllm.config import ModelConfig
    from vllm.multimodal import MULTIMODAL_REGISTRY

    config = ModelConfig(model=str(model), max_model_len=8192, dtype="float32")
    return MULTIMODAL_REGISTRY.create_processor(config)


def chat_text(hf, count: int) -> str:
    content = [{"type": "image"} for _ in range(count)] + [{"type": "text", "text": "hi"}]
    return hf.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
    )


def expanded(ours, unexpanded: list[int], replacements) -> tuple[list[int], list]:
    ids, (ranges,) = expand(unexpanded, [Placeholders("image", ours.anchor_token_id, replacements)])
    return ids, ranges


def hf_kwargs(options: dict) -> dict:
    """The request's options as transformers' processor takes them (nested or not)."""
    return {
        **options.get("images_kwargs", {}),
        **{k: v for k, v in options.items() if k != "images_kwargs"},
    }


def check(hf, ours, images, raw: bool, hf_images=None, **options):
    """Ours against transformers' processor on the same chat prompt; returns ours."""
    text = chat_text(hf, len(images))
    extra = {"do_rescale": False, "do_normalize": False} if raw else {}
    out = hf(
        text=[text], images=hf_images or images, return_tensors="np", **extra, **hf_kwargs(options)
    )
    got = ours.process([np.asarray(i) for i in images], ours.resolve(options), raw_pixels=raw)
    want, have = out["pixel_values"], got.tensors["pixel_values"]
    assert have.shape == want.shape
    # transformers leaves pixels uint8 with do_rescale/do_normalize off: the raw encoding.
    assert have.dtype == want.dtype == (np.uint8 if raw else np.float32)
    diff = np.abs(have.astype(np.float64) - want.astype(np.float64))
    assert diff.max() <= (0 if raw else 1e-5), f"max abs diff {diff.max()}"
    positions = got.tensors["pixel_position_ids"]
    assert positions.dtype == np.int64
    assert np.array_equal(positions, out["image_position_ids"])
    ids, ranges = expanded(ours, hf.tokenizer(text)["input_ids"], got.replacements)
    assert ids == out["input_ids"][0].tolist()
    image = hf.tokenizer.convert_tokens_to_ids(IMAGE)
    assert got.embed_token_id == image
    boi, eoi = hf.tokenizer.convert_tokens_to_ids([BOI, EOI])
    for (offset, length), row in zip(ranges, positions):
        # <|image>, one <|image|> per 3x3 block of the image's real patches, <image|>
        real = int((row[:, 0] >= 0).sum())
        assert ids[offset] == boi and ids[offset + length - 1] == eoi
        assert ids[offset + 1 : offset + length - 1] == [image] * (real // 9)
    return got


@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float"])
@pytest.mark.parametrize("name", IMAGES)
def test_one_image_matches_transformers(hf, ours, name, raw):
    got = check(hf, ours, [IMAGES[name]], raw)
    assert got.tensors["pixel_values"].shape == (1, SOFT_TOKENS * 9, 16 * 16 * 3)
    assert 2 < len(got.replacements[0]) <= SOFT_TOKENS + 2


@pytest.fixture(scope="module")
def vllm_decode():
    from vllm.multimodal.media import ImageMediaIO

    return lambda data: ImageMediaIO().load_bytes(data).media


@pytest.mark.parametrize("options", [{}, {"max_soft_tokens": 70}], ids=option_id)
@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float"])
@pytest.mark.parametrize("path", COMMITTED, ids=[p.stem for p in COMMITTED])
def test_committed_image_matches_vllm_decode_then_transformers(
    hf, ours, vllm_decode, path, raw, options
):
    data = path.read_bytes()
    pixels = np.asarray(decode_pixels(data, MediaPolicy())[0])  # the gateway's decode
    check(hf, ours, [pixels], raw, hf_images=[vllm_decode(data)], **options)


@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float"])
def test_several_mixed_images_in_one_request(hf, ours, raw):
    got = check(hf, ours, [IMAGES[n] for n in MIXED], raw)
    # 90x400 1280x960 10x12 333x177 600x8: each fills the 280-token budget as its shape allows
    assert [len(r) - 2 for r in got.replacements] == [245, 266, 270, 264, 144]
    assert got.batched_keys == ("pixel_values", "pixel_position_ids")
    assert got.flat_keys == {} and got.keep_on_cpu_keys == ()


@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float"])
@pytest.mark.parametrize("options", OPTIONS, ids=option_id)
def test_each_option_matches_transformers(hf, ours, options, raw):
    check(hf, ours, [IMAGES[n] for n in MIXED], raw, **options)


def test_the_budget_changes_the_tokens_and_the_padding(ours):
    images = [np.asarray(IMAGES[n]) for n in MIXED]
    for budget in SUPPORTED_SOFT_TOKENS:
        got = ours.process(images, ours.resolve({"max_soft_tokens": budget}), raw_pixels=True)
        counts = [len(r) - 2 for r in got.replacements]
        assert got.tensors["pixel_values"].shape == (5, budget * 9, 768)
        assert all(budget // 2 < n <= budget for n in counts[:4]), counts
        for count, grid in zip(counts, got.tensors["pixel_position_ids"]):
            # one token per 3x3 block of the patch grid, the rest padding
            cols, rows = grid.max(axis=0) + 1
            assert count == (cols // 3) * (rows // 3) <= budget
            assert (grid[9 * count :] == -1).all()


def vllm_apply(vllm_processor, unexpanded: list[int], images, options: dict):
    from vllm.multimodal.processing.context import TimingContext
    from vllm.multimodal.processing.inputs import ProcessorInputs

    items = vllm_processor.info.parse_mm_data({"image": list(images)})
    inputs = ProcessorInputs(unexpanded, items, hf_processor_mm_kwargs=options)
    return vllm_processor.apply(inputs, TimingContext(enabled=False))


@pytest.mark.parametrize("options", OPTIONS, ids=option_id)
def test_ids_ranges_and_tensors_equal_vllm_s_own_processor(hf, ours, vllm_processor, options):
    images = [IMAGES[n] for n in MIXED]
    unexpanded = hf.tokenizer(chat_text(hf, len(images)))["input_ids"]
    theirs = vllm_apply(vllm_processor, unexpanded, images, options)
    got = ours.process([np.asarray(i) for i in images], ours.resolve(options), raw_pixels=False)
    ids, ranges = expanded(ours, unexpanded, got.replacements)
    assert ids == theirs["prompt_token_ids"]
    data = theirs["mm_kwargs"].get_data()
    assert set(data) == set(got.tensors)
    for key, tensor in got.tensors.items():
        assert tensor.shape == tuple(data[key].shape), key
        assert np.abs(tensor - data[key].numpy()).max() <= 1e-5, key
    placeholders = theirs["mm_placeholders"]["image"]
    assert ranges == [(p.offset, p.length) for p in placeholders]
    for placeholder, replacement in zip(placeholders, got.replacements):
        embeds = [t == got.embed_token_id for t in replacement]
        assert placeholder.is_embed.tolist() == embeds


def sizes_to_count() -> list[tuple[int, int]]:
    rng = np.random.default_rng(0)
    sizes = [(h, w) for h in range(1, 200, 3) for w in (1, 2, 5, 47, 48, 49, 96, 300, 4000)]
    sizes += [tuple(int(x) for x in rng.integers(1, 8000, 2)) for _ in range(4000)]
    # exact fits of the budgets' areas, and their neighbours
    sizes += [
        (48 * a + d, 48 * b - d)
        for a in range(1, 40, 3)
        for b in range(1, 40, 4)
        for d in (-1, 0, 1)
        if 48 * a + d > 0 and 48 * b - d > 0
    ]
    sizes += [(k, 100 * k) for k in range(1, 30)] + [(100 * k, k) for k in range(1, 30)]
    return sizes


@pytest.mark.parametrize("budget", SUPPORTED_SOFT_TOKENS)
def test_soft_token_counts_are_vllm_s(ours, vllm_processor, budget):
    """vLLM counts an image's tokens with a formula of its own (_compute_num_soft_tokens, from
    the image size and the vision config); ours come from the resized size: equal."""
    info = vllm_processor.info
    settings = ours.resolve({"max_soft_tokens": budget})
    for h, w in sizes_to_count():
        want = info._compute_num_soft_tokens(w, h, max_soft_tokens=budget)
        assert ours.num_soft_tokens(h, w, settings) == want, (h, w)


def test_replacements_are_vllm_s(ours, vllm_processor):
    info = vllm_processor.info
    hf_processor = info.get_hf_processor()
    for h, w in sizes_to_count()[:300]:
        for budget in (None, 70, 1120):
            settings = ours.resolve({} if budget is None else {"max_soft_tokens": budget})
            repl = info.get_image_repl(
                image_width=w, image_height=h, processor=hf_processor, max_soft_tokens=budget
            )
            assert ours.replacement(ours.num_soft_tokens(h, w, settings)) == repl.full, (h, w)


def test_target_size_is_transformers(hf):
    from transformers.models.gemma4.image_processing_gemma4 import (
        get_aspect_ratio_preserving_size,
    )

    for h, w in sizes_to_count():
        for budget in SUPPORTED_SOFT_TOKENS:
            want = get_aspect_ratio_preserving_size(h, w, 16, budget * 9, 3)
            assert target_size(h, w, 16, 3, budget) == want, (h, w, budget)


@pytest.mark.parametrize("native", [True, False], ids=["native", "numpy"])
def test_both_resize_paths_match(hf, ours, monkeypatch, native):
    from multimodal.processors import transforms

    monkeypatch.setattr(transforms.native, "AVAILABLE", native and transforms.native.AVAILABLE)
    for raw in (True, False):
        check(hf, ours, [IMAGES["large"], IMAGES["tall"]], raw, max_soft_tokens=560)


def test_normalizing_configs_match_transformers(model, tmp_path):
    """A processor config that normalizes (the released one only rescales): (x - m/r) / (s/r)
    fused as transformers does, with and without the rescale."""
    from transformers import AutoProcessor

    for do_rescale in (True, False):
        copy = shutil.copytree(model, tmp_path / f"normalizing-{do_rescale}")
        config = json.loads((copy / "processor_config.json").read_text())
        config["image_processor"].update(
            do_normalize=True, do_rescale=do_rescale, image_mean=[0.5, 0.4, 0.3], image_std=0.25
        )
        (copy / "processor_config.json").write_text(json.dumps(config))
        ours, hf = load_processor(copy), AutoProcessor.from_pretrained(copy)
        check(hf, ours, [IMAGES[n] for n in ("odd", "tiny")], raw=False)
        check(hf, ours, [IMAGES["odd"]], raw=True)


def test_the_pipeline_expands_and_marks_embeddings(hf, ours):
    unexpanded = hf.tokenizer(chat_text(hf, 2))["input_ids"]
    images = [np.asarray(IMAGES["square"]), np.asarray(IMAGES["wide"])]
    got = ours.process(images, ours.resolve({}), raw_pixels=False)
    want_ids, want_ranges = expanded(ours, unexpanded, got.replacements)
    # Stand-ins for multimodal.media.LoadedImage: what the pipeline reads of an item.
    items = [SimpleNamespace(data=b"%d" % i, pixels=p) for i, p in enumerate(images)]
    prepared = prepare([(ours, items)], unexpanded, {}, PixelEncoding(raw=False))
    assert prepared.prompt_ids == want_ids
    assert prepared.parts[0].ranges == want_ranges
    (mm,) = prepared.mm_inputs
    assert mm.im_token_id == ours.image_token
    assert list(mm.batched_keys) == ["pixel_values", "pixel_position_ids"]
    assert mm.pixel_values.dtype == "float32"
    assert mm.model_specific_tensors["pixel_position_ids"].dtype == "int64"


def test_the_budget_is_in_every_item_s_hash(ours):
    items = [SimpleNamespace(data=b"same bytes", pixels=np.asarray(IMAGES["square"]))]
    anchor = [ours.anchor_token_id]
    hashes = {
        budget: prepare([(ours, items)], anchor, kwargs, PixelEncoding(raw=False)).parts[0].hashes
        for budget, kwargs in [
            (None, {}),
            (280, {"max_soft_tokens": 280}),
            (281, {"images_kwargs": {"max_soft_tokens": 280}}),
            (70, {"max_soft_tokens": 70}),
        ]
    }
    # the default, and 280 asked for either way, are the same settings; 70 is not
    assert hashes[None] == hashes[280] == hashes[281] != hashes[70]


def test_defaults_and_settings(ours):
    assert ours.resolve({}) == Gemma4Settings(280) == ours.resolve({"max_soft_tokens": 280})
    assert ours.resolve({"images_kwargs": {"max_soft_tokens": 560}}) == Gemma4Settings(560)
    assert ours.resolve({"max_soft_tokens": 70, "images_kwargs": {"max_soft_tokens": 70}}) == (
        Gemma4Settings(70)
    )
    assert ours.placeholder_text == "<image_soft_token>"  # vLLM's get_placeholder_str
    assert ours.anchor_token_id == ours.image_token


@pytest.mark.parametrize(
    "options, message",
    [
        ({"max_soft_tokens": 100}, "max_soft_tokens must be one of 70, 140, 280, 560, 1120"),
        ({"max_soft_tokens": 0}, "max_soft_tokens must be a positive integer"),
        ({"max_soft_tokens": "280"}, "max_soft_tokens must be a positive integer"),
        ({"images_kwargs": {"max_soft_tokens": 10}}, "images_kwargs.max_soft_tokens must be one"),
        ({"images_kwargs": 280}, "images_kwargs must be an object"),
        ({"images_kwargs": {"patch_size": 14}}, "unsupported mm_processor_kwargs"),
        ({"max_soft_tokens": 70, "images_kwargs": {"max_soft_tokens": 140}}, "differ"),
        ({"patch_size": 14}, "unsupported mm_processor_kwargs"),
        ({"pooling_kernel_size": 2}, "unsupported mm_processor_kwargs"),
        ({"do_resize": False}, "unsupported mm_processor_kwargs"),
    ],
)
def test_bad_options_are_refused(ours, options, message):
    with pytest.raises(OptionError, match=message):
        ours.resolve(options)


def test_families_are_told_apart():
    from multimodal.registry import FAMILIES

    gemma = {"model_type": "gemma4", "vision_config": {"model_type": "gemma4_vision"}}
    for config, pre, expected in [
        (gemma, {"image_processor_type": "Gemma4ImageProcessor"}, True),
        (gemma, {"image_processor_type": "Gemma4ImageProcessorFast"}, True),
        (gemma, {}, True),
        (gemma, {"image_processor_type": "SiglipImageProcessor"}, False),
        ({"model_type": "gemma4_text"}, {}, False),
        ({"model_type": "gemma4_unified"}, {"image_processor_type": "Gemma4ImageProcessor"}, False),
        ({"model_type": "gemma3"}, {"image_processor_type": "Gemma3ImageProcessor"}, False),
    ]:
        files = SimpleNamespace(config=config, preprocessor=pre, video_preprocessor={}, vocab={})
        assert Gemma4Processor.matches(files) == expected
        if config is gemma:  # and no other family claims a Gemma 4 model
            others = [f for f in FAMILIES if f is not Gemma4Processor and f.matches(files)]
            assert others == []


def _edited(model, tmp_path, name: str, config=None, image_processor=None):
    copy = shutil.copytree(model, tmp_path / name)
    if config:
        data = json.loads((copy / "config.json").read_text())
        data["vision_config"].update(config)
        (copy / "config.json").write_text(json.dumps(data))
    if image_processor:
        data = json.loads((copy / "processor_config.json").read_text())
        data["image_processor"].update(image_processor)
        (copy / "processor_config.json").write_text(json.dumps(data))
    return copy


@pytest.mark.parametrize(
    "config, image_processor, message",
    [
        # vLLM would count 560 tokens per image while the pixels hold 280 worth
        ({"default_output_length": 560}, None, "default_output_length"),
        (None, {"max_soft_tokens": 100}, "must be one of"),
        ({"patch_size": 14}, None, "differ from the vision tower"),
        (None, {"pooling_kernel_size": 2}, "differ from the vision tower"),
        (None, {"do_resize": False}, "do_resize"),
        (None, {"resample": 1}, "resample mode 1"),
    ],
)
def test_models_vllm_cannot_serve_consistently_are_refused(
    model, tmp_path, config, image_processor, message
):
    copy = _edited(model, tmp_path, "edited", config, image_processor)
    with pytest.raises(ModelConfigError, match=message):
        load_processor(copy)


def test_a_config_without_default_output_length_counts_with_the_processor_s(model, tmp_path):
    # transformers writes no default_output_length (vLLM then fails to start): the processor's
    # budget is the only one there is.
    copy = shutil.copytree(model, tmp_path / "no-default")
    data = json.loads((copy / "config.json").read_text())
    del data["vision_config"]["default_output_length"]
    (copy / "config.json").write_text(json.dumps(data))
    assert load_processor(copy).defaults == Gemma4Settings(SOFT_TOKENS)


def test_every_image_fits_its_budget_in_whole_blocks():
    for h, w in sizes_to_count():
        for budget in SUPPORTED_SOFT_TOKENS:
            th, tw = target_size(h, w, 16, 3, budget)
            assert th % 48 == tw % 48 == 0 and th >= 48 and tw >= 48
            assert (th // 48) * (tw // 48) <= budget
