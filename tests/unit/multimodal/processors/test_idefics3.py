"""Idefics3 and SmolVLM preprocessing against transformers' Idefics3Processor and
SmolVLMProcessor (torchvision backend, the transformers 5 default, which vLLM runs) on weightless
tiny model dirs with the released settings (LANCZOS, each family's tile and token geometry),
and the replacements against vLLM's own Idefics3ProcessingInfo / SmolVLMProcessingInfo.
"""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import numpy as np
import pytest

from multimodal.decode import decode_pixels
from multimodal.policy import MediaPolicy
from multimodal.processors.base import OptionError
from multimodal.processors.idefics3 import (
    Idefics3Processor,
    Idefics3Tiling,
    ImageTokens,
    SmolVLMProcessor,
    replacement_text,
    vllm_rows_cols,
)
from multimodal.prompt import Placeholders, expand
from tests.support import IMAGES_DIR, load_processor
from tests.support.idefics3_models import BICUBIC, IDEFICS3, SMOLVLM, build_model
from tests.support.synthetic_images import IMAGES

COMMITTED = sorted(IMAGES_DIR.glob("*.[jp][pn]g"))
NEAREST = 0
TILE = IDEFICS3.tile


@pytest.fixture(scope="module", params=[IDEFICS3, SMOLVLM], ids=lambda v: v.model_type)
def variant(request):
    if request.param is SMOLVLM:
        pytest.importorskip("num2words", reason="transformers' SmolVLMProcessor needs num2words")
    return request.param


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, variant):
    return build_model(tmp_path_factory.mktemp(variant.model_type), weights=False, variant=variant)


def loaded(model_dir):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(model_dir), load_processor(model_dir)


@pytest.fixture(scope="module")
def model(model_dir):
    return loaded(model_dir)


def reference(hf, images, raw: bool, kwargs: dict):
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": "hi"}]
    text = hf.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
    )
    extra = {"do_rescale": False, "do_normalize": False} if raw else {}
    out = hf(text=[text], images=[list(images)], return_tensors="np", **extra, **kwargs)
    return out, hf.tokenizer(text)["input_ids"]


def check(model, images, raw: bool, kwargs: dict | None = None):
    hf, ours = model
    kwargs = kwargs or {}
    out, unexpanded = reference(hf, images, raw, kwargs)
    arrays = [np.asarray(i) for i in images]
    got = ours.process(arrays, ours.resolve(kwargs), raw_pixels=raw)
    # vLLM drops the processor's batch dimension of one prompt.
    want, have = out["pixel_values"][0], got.tensors["pixel_values"]
    assert have.shape == want.shape
    # transformers pads into a float32 tensor even without rescale/normalize; raw stays uint8.
    assert have.dtype == (np.uint8 if raw else np.float32)
    diff = np.abs(have.astype(np.float64) - want.astype(np.float64))
    assert diff.max() <= (0 if raw else 1e-5), f"max abs diff {diff.max()}"
    mask = got.tensors["pixel_attention_mask"]
    assert mask.dtype == out["pixel_attention_mask"].dtype == np.int64
    assert np.array_equal(mask, out["pixel_attention_mask"][0])
    assert got.tensors["num_patches"].sum() == len(want)
    assert got.flat_keys == {"pixel_values": "num_patches", "pixel_attention_mask": "num_patches"}
    ids, (ranges,) = expand(
        unexpanded, [Placeholders("image", ours.anchor_token_id, got.replacements)]
    )
    assert ids == [int(i) for i in out["input_ids"][0]]
    assert [n for _, n in ranges] == [len(r) for r in got.replacements]
    assert got.embed_token_id == ours.anchor_token_id
    check_vllm(hf, ours, arrays, got, kwargs)
    return got


def check_vllm(hf, ours, arrays, got, kwargs):
    """Replacements and num_patches as vLLM's processing info computes them."""
    from vllm.model_executor.models.idefics3 import Idefics3ProcessingInfo
    from vllm.model_executor.models.smolvlm import SmolVLMProcessingInfo

    kind = SmolVLMProcessingInfo if isinstance(ours, SmolVLMProcessor) else Idefics3ProcessingInfo
    info = object.__new__(kind)
    info.ctx = SimpleNamespace(get_merged_mm_kwargs=lambda kw: dict(kw))
    for image, repl, count in zip(arrays, got.replacements, got.tensors["num_patches"]):
        size = {"image_height": image.shape[0], "image_width": image.shape[1]}
        text = info.get_image_repl(**size, processor=hf, mm_kwargs=kwargs)
        assert repl == hf.tokenizer(text, add_special_tokens=False)["input_ids"]
        assert count == info.get_num_patches(**size, processor=hf, mm_kwargs=kwargs)
        tokens = info.get_num_image_tokens(**size, processor=hf, mm_kwargs=kwargs)
        assert repl.count(ours.anchor_token_id) == tokens


@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float"])
@pytest.mark.parametrize("name", IMAGES)
def test_synthetic_image_matches_transformers(model, name, raw):
    check(model, [IMAGES[name]], raw)


@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float"])
@pytest.mark.parametrize("path", COMMITTED, ids=[p.name for p in COMMITTED])
def test_committed_image_matches_transformers(model, path, raw):
    pixels = np.asarray(decode_pixels(path.read_bytes(), MediaPolicy())[0])
    check(model, [pixels], raw)


@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float"])
def test_several_images_in_one_request(model, variant, raw):
    images = [IMAGES[n] for n in ("large", "tiny", "tall", "odd", "very thin")]
    got = check(model, images, raw)
    # The long edge goes to 4 tiles up or down (Idefics3 1456, SmolVLM 2048): 1280x960 -> 4x3
    # tiles + the global one, 10x12 -> 4x4 + 1, 90x400 -> 4x1 + 1.
    assert got.tensors["num_patches"].tolist()[:3] == [13, 17, 5]
    image_id = model[1].anchor_token_id
    assert [r.count(image_id) for r in got.replacements[:3]] == [
        variant.image_seq_len * n for n in (13, 17, 5)
    ]


OPTIONS = [  # in tiles: multiplied by the variant's tile side
    {"do_image_splitting": False},
    {"do_image_splitting": True},
    {"size": 2},
    {"size": 1},
    {"max_image_size": 1},
    {"do_image_splitting": False, "size": 3},
]


def in_pixels(options: dict, tile: int) -> dict:
    return {k: v if isinstance(v, bool) else {"longest_edge": v * tile} for k, v in options.items()}


@pytest.mark.parametrize("options", OPTIONS, ids=str)
@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float"])
def test_options_match_transformers(model, variant, options, raw):
    kwargs = in_pixels(options, variant.tile)
    check(model, [IMAGES[n] for n in ("large", "square", "wide")], raw, kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"size": {"longest_edge": 1000}}, "multiple of the tile side {tile}"),
        ({"max_image_size": {"longest_edge": 400}}, "model's tile side {tile}"),
        ({"size": {"shortest_edge": 10}}, "unsupported"),
        ({"do_image_splitting": "yes"}, "true or false"),
        ({"image_seq_len": 64}, "unsupported"),
    ],
)
def test_refused_options(model, variant, kwargs, message):
    with pytest.raises(OptionError, match=message.format(tile=variant.tile)):
        model[1].resolve(kwargs)


def test_settings_hold_what_changes_the_tensors(model, variant):
    ours = model[1]
    one = ours.process(
        [np.asarray(IMAGES["tiny"])], ours.resolve({"do_image_splitting": False}), False
    )
    assert one.tensors["num_patches"].tolist() == [1]
    assert len(one.replacements[0]) == variant.image_seq_len + 3  # fake, global tag, run, fake
    assert ours.resolve({}) == ours.resolve({"do_image_splitting": True})
    assert ours.resolve({}) != ours.resolve({"do_image_splitting": False})
    twice = 2 * variant.tile
    assert ours.resolve({"size": {"longest_edge": twice}}).longest_edge == twice
    assert ours.placeholder_text == "<image>"
    assert ours.settings.pixels.method == "lanczos"  # the released resample


@pytest.fixture(scope="module")
def bicubic(tmp_path_factory):
    return loaded(build_model(tmp_path_factory.mktemp("bicubic"), weights=False, resample=BICUBIC))


@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float"])
@pytest.mark.parametrize("path", COMMITTED, ids=[p.name for p in COMMITTED])
def test_a_bicubic_config_matches_transformers(bicubic, path, raw):
    assert bicubic[1].settings.pixels.method == "bicubic"
    pixels = np.asarray(decode_pixels(path.read_bytes(), MediaPolicy())[0])
    check(bicubic, [pixels], raw)


def test_another_filter_is_left_to_the_workers(model_dir, tmp_path):
    """NEAREST (or BOX, HAMMING): not in multimodal.resize, so no family here serves it."""
    from gateway.render.model_files import ModelFiles
    from multimodal.registry import processors_for

    nearest = shutil.copytree(model_dir, tmp_path / "nearest")
    pre = json.loads((nearest / "preprocessor_config.json").read_text())
    (nearest / "preprocessor_config.json").write_text(json.dumps({**pre, "resample": NEAREST}))
    assert processors_for(ModelFiles.load(nearest)).by_modality == {}
    assert processors_for(ModelFiles.load(model_dir)).by_modality  # its LANCZOS original


def test_smolvlm_reads_its_token_strings_from_the_tokenizer_config():
    """SmolVLMProcessor takes getattr(tokenizer, "image_token", "<image>") and the like; vLLM
    builds the replacement from them (SmolVLMProcessingInfo._get_image_token)."""
    from vllm.model_executor.models.smolvlm import SmolVLMProcessingInfo

    from gateway.render.model_files import tokenizer_named_tokens

    config = {  # transformers 5 writes named tokens at the top; the other layout nests them
        "image_token": "<img>",
        "extra_special_tokens": {"fake_image_token": {"content": "<around>"}},
        "eos_token": "<end>",
    }
    files = SimpleNamespace(named_tokens=tokenizer_named_tokens(config))  # as ModelFiles reads
    tokens = SmolVLMProcessor.image_tokens(files)
    assert tokens == ImageTokens(image="<img>", fake="<around>", global_tag="<global-img>")
    assert Idefics3Processor.image_tokens(files) == ImageTokens()  # fixed in Idefics3Processor
    from transformers import SmolVLMImageProcessor

    grids = set()
    for tiles in (1, 2):  # one tile (no grid), and grids of up to 2x2
        tiling = Idefics3Tiling(do_image_splitting=True, longest_edge=tiles * 364, tile=364)
        image_processor = SmolVLMImageProcessor(
            size={"longest_edge": tiling.longest_edge}, max_image_size={"longest_edge": 364}
        )
        hf = SimpleNamespace(
            image_processor=image_processor, image_token="<img>", fake_image_token="<around>",
            global_image_token="<global-img>", image_seq_len=3,
        )  # fmt: skip
        info = object.__new__(SmolVLMProcessingInfo)
        info.ctx = SimpleNamespace(get_merged_mm_kwargs=lambda kw: dict(kw))
        for height, width in [(300, 300), (700, 200), (200, 700)]:
            want = info.get_image_repl(
                image_height=height, image_width=width, processor=hf, mm_kwargs={}
            )
            rows, cols = vllm_rows_cols(height, width, tiling)
            assert replacement_text(rows, cols, 3, tokens) == want
            grids.add((rows, cols))
    assert grids == {(0, 0), (2, 2), (2, 1), (1, 2)}


def test_families_are_told_apart():
    from multimodal.registry import FAMILIES

    pre = {"image_processor_type": "Idefics3ImageProcessor", "resample": 1}
    for model_type, want in [("idefics3", Idefics3Processor), ("smolvlm", SmolVLMProcessor)]:
        files = SimpleNamespace(
            config={"model_type": model_type}, preprocessor=pre, video_preprocessor={}, vocab={}
        )
        assert [f for f in FAMILIES if f.matches(files)] == [want]
    smol = {"image_processor_type": "SmolVLMImageProcessor", "resample": 1}
    files = SimpleNamespace(
        config={"model_type": "smolvlm"}, preprocessor=smol, video_preprocessor={}, vocab={}
    )
    assert [f for f in FAMILIES if f.matches(files)] == [SmolVLMProcessor]
    for other in ("llava", "idefics2", "gemma3", "qwen2_vl"):
        files = SimpleNamespace(
            config={"model_type": other}, preprocessor=pre, video_preprocessor={}, vocab={}
        )
        assert not Idefics3Processor.matches(files) and not SmolVLMProcessor.matches(files)


def test_the_numpy_tiles_equal_the_native_ones(model, monkeypatch):
    """Without the native kernels the tiles are cut by numpy: the same bytes."""
    from multimodal import native

    ours = model[1]
    images = [np.asarray(IMAGES[n]) for n in ("large", "tiny", "wide")]
    for kwargs in ({}, {"do_image_splitting": False}):
        settings = ours.resolve(kwargs)
        with monkeypatch.context() as patch:
            patch.setattr(native, "AVAILABLE", False)
            plain = ours.process(images, settings, raw_pixels=True).tensors["pixel_values"]
        fused = ours.process(images, settings, raw_pixels=True).tensors["pixel_values"]
        assert np.array_equal(plain, fused)
