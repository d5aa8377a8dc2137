"""Llama 4 preprocessing against transformers' Llama4Processor (torchvision backend, the default
in transformers 5, which vLLM runs) and against vLLM's own multimodal processor for the family,
run offline on the same model dir (no engine).

The model dir is the tiny Llama 4 of tests/support/llama4_models.py without weights. Pixels:
uint8 identical with rescale and normalize off; floats (bfloat16 in transformers, float32
holding the same values here) within 1e-5, in practice identical.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from multimodal.decode import decode_pixels
from multimodal.policy import MediaPolicy
from multimodal.processors import llama4, transforms
from multimodal.processors.base import OptionError
from multimodal.processors.llama4 import (
    Llama4Options,
    Llama4Processor,
    Llama4Tiling,
    best_fit,
    fitted_size,
    supported_resolutions,
)
from multimodal.prompt import Placeholders, expand
from tests.support import IMAGES_DIR, load_processor
from tests.support.llama4_models import IMAGE, PATCH, build_model
from tests.support.synthetic_images import IMAGES

COMMITTED = sorted(IMAGES_DIR.glob("*.[jp][pn]g"))
MIXED = ["tall", "large", "tiny", "odd", "very thin"]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("llama4") / "model", weights=False)


@pytest.fixture(scope="module")
def hf(model):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(model)


@pytest.fixture(scope="module")
def ours(model) -> Llama4Processor:
    return load_processor(model)


def chat_text(hf, count: int) -> str:
    content = [{"type": "image"} for _ in range(count)] + [{"type": "text", "text": "hi"}]
    return hf.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
    )


def check(hf, ours, images, raw: bool, hf_images=None, **kwargs):
    """Ours against transformers' processor on the same chat prompt; returns ours."""
    text = chat_text(hf, len(images))
    extra = {"do_rescale": False, "do_normalize": False} if raw else {}
    out = hf(text=[text], images=hf_images or images, return_tensors="pt", **extra, **kwargs)
    got = ours.process([np.asarray(i) for i in images], ours.resolve(kwargs), raw_pixels=raw)
    want, have = out["pixel_values"], got.tensors["pixel_values"]
    assert have.shape == tuple(want.shape)
    assert have.dtype == (np.uint8 if raw else np.float32)
    if raw:
        assert np.array_equal(have, want.numpy())
    else:  # transformers' bfloat16, ours float32 holding bfloat16 values
        diff = np.abs(have.astype(np.float64) - want.float().numpy())
        assert diff.max() <= 1e-5, f"max abs diff {diff.max()}"
    # The processor drops the image processor's aspect_ratios (unused_input_names): ask it.
    hf_ratios = hf.image_processor(images=hf_images or images, **kwargs)["aspect_ratios"]
    ratios = got.tensors["aspect_ratios"]
    assert ratios.dtype == np.int64 and ratios.tolist() == [list(r) for r in hf_ratios]
    sizes = got.tensors["patches_per_image"]
    assert sizes.dtype == np.int64 and sizes.shape == (len(images),)
    assert sizes.tolist() == [1 if h * w == 1 else 1 + h * w for h, w in ratios.tolist()]
    assert int(sizes.sum()) == have.shape[0]
    unexpanded = hf.tokenizer(text)["input_ids"]
    placeholders = Placeholders("image", ours.anchor_token_id, got.replacements)
    ids, (ranges,) = expand(unexpanded, [placeholders])
    assert ids == out["input_ids"][0].tolist()
    patch = hf.tokenizer.convert_tokens_to_ids(PATCH)
    assert got.embed_token_id == patch
    for (offset, length), (h, w) in zip(ranges, ratios.tolist()):
        embeds = sum(t == patch for t in ids[offset : offset + length])
        assert embeds == (1 if h * w == 1 else 1 + h * w) * 144
    return got


@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float"])
@pytest.mark.parametrize("name", IMAGES)
def test_one_image_matches_transformers(hf, ours, name, raw):
    check(hf, ours, [IMAGES[name]], raw)


@pytest.fixture(scope="module")
def vllm_decode():
    from vllm.multimodal.media import ImageMediaIO

    return lambda data: ImageMediaIO().load_bytes(data).media


@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float"])
@pytest.mark.parametrize("path", COMMITTED, ids=[p.stem for p in COMMITTED])
def test_committed_image_matches_vllm_decode_then_transformers(hf, ours, vllm_decode, path, raw):
    data = path.read_bytes()
    pixels = np.asarray(decode_pixels(data, MediaPolicy())[0])  # the gateway's decode
    check(hf, ours, [pixels], raw, hf_images=[vllm_decode(data)])


@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float"])
def test_several_mixed_images_in_one_request(hf, ours, raw):
    got = check(hf, ours, [IMAGES[n] for n in MIXED], raw)
    assert got.tensors["aspect_ratios"].tolist() == [[2, 1], [3, 4], [1, 1], [1, 1], [1, 2]]
    assert got.tensors["patches_per_image"].tolist() == [3, 13, 1, 1, 3]
    assert got.batched_keys == ("patches_per_image", "aspect_ratios")
    assert got.flat_keys == {"pixel_values": "patches_per_image"}
    assert got.keep_on_cpu_keys == ("patches_per_image", "aspect_ratios")


@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float"])
@pytest.mark.parametrize("to_max", [True, False])
def test_resize_to_max_canvas_matches_transformers(hf, ours, raw, to_max):
    images = [IMAGES[n] for n in ("tiny", "odd", "wide", "square")]
    got = check(hf, ours, images, raw, resize_to_max_canvas=to_max)
    if to_max:  # small images are blown up to the biggest canvas of their aspect ratio
        assert got.tensors["patches_per_image"].tolist() == [17, 16, 17, 17]


def test_options(ours):
    assert ours.resolve({}) == Llama4Tiling(max_patches=16, resize_to_max_canvas=False)
    assert ours.resolve({"resize_to_max_canvas": True}) == Llama4Tiling(16, True)
    assert ours.resolve({"resize_to_max_canvas": None}) == ours.resolve({})
    assert Llama4Processor.options is Llama4Options
    with pytest.raises(OptionError, match="resize_to_max_canvas must be true or false"):
        ours.resolve({"resize_to_max_canvas": 1})
    # vLLM passes max_patches to transformers but counts tokens with the model's: refused.
    for refused in ({"max_patches": 4}, {"do_resize": False}, {"size": {"height": 224}}):
        with pytest.raises(OptionError, match=r"accepted: resize_to_max_canvas"):
            ours.resolve(refused)


def sizes_to_fit():
    rng = np.random.default_rng(0)
    sizes = [tuple(int(x) for x in rng.integers(1, 5000, 2)) for _ in range(600)]
    # Ratios at a canvas's, where float32 and float64 scales pick differently.
    sizes += [(k, 3 * k) for k in range(1, 800, 7)] + [(7 * k, 5 * k) for k in range(1, 300, 7)]
    sizes += [(336 * a + d, 336 * b + e) for a in (1, 2, 4) for b in (1, 3) for d in (-1, 0, 1)
              for e in (-1, 0, 1)]  # fmt: skip
    return sizes


@pytest.mark.parametrize("to_max", [False, True])
@pytest.mark.parametrize(("max_patches", "tile"), [(16, 336), (5, 224)])
def test_canvas_and_resize_sizes_are_transformers(max_patches, tile, to_max):
    """The float32 quirks of transformers' get_best_fit and get_max_res_without_distortion
    (torch scalars in the arithmetic) are reproduced: a float64 version differs on ~0.7% of
    these sizes by a canvas or a pixel."""
    import torch
    from transformers.image_utils import SizeDict
    from transformers.models.llama4 import image_processing_llama4 as hf_llama4

    size = SizeDict(height=tile, width=tile)
    resolutions = hf_llama4.find_supported_resolutions(max_num_chunks=max_patches, patch_size=size)
    assert supported_resolutions(max_patches, tile) == tuple(tuple(r) for r in resolutions)
    canvases = torch.tensor(resolutions)
    for h, w in sizes_to_fit():
        # Llama4ImageProcessor._preprocess, step by step.
        target = hf_llama4.get_best_fit((h, w), canvases, resize_to_max_canvas=to_max)
        if not to_max:
            target = (min(max(h, tile), target[0]), min(max(w, tile), target[1]))
        new_h, new_w = hf_llama4.get_max_res_without_distortion((h, w), target)
        canvas = best_fit(h, w, supported_resolutions(max_patches, tile), to_max)
        want_canvas = hf_llama4.get_best_fit((h, w), canvases, resize_to_max_canvas=to_max)
        assert canvas == tuple(int(x) for x in want_canvas), (h, w)
        assert fitted_size(h, w, canvas, tile, to_max) == (max(new_h, 1), max(new_w, 1)), (h, w)


def test_normalization_table_is_torch_bfloat16():
    import torch
    from torchvision.transforms.v2 import functional as tvF

    cases = [((0.5,) * 3, (0.5,) * 3, 1 / 255), ((0.48, 0.45, 0.4), (0.27, 0.26, 0.28), 1 / 256)]
    for mean, std, factor in cases:
        settings = llama4.Llama4Settings(
            336, 16, False, "bilinear", True, factor, True, mean, std, 144
        )
        values = torch.arange(256, dtype=torch.uint8).view(1, 1, 256).expand(3, 1, 256)
        # Llama4ImageProcessor.rescale_and_normalize with both on.
        want = tvF.normalize(values.to(torch.bfloat16) * factor, list(mean), list(std))
        assert np.array_equal(llama4.normalization_table(settings), want.float().numpy()[:, 0])


@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float"])
def test_numpy_path_equals_native(ours, monkeypatch, raw):
    images = [np.asarray(IMAGES[n]) for n in MIXED]
    native = ours.process(images, ours.resolve({}), raw)
    monkeypatch.setattr(transforms.native, "AVAILABLE", False)
    plain = ours.process(images, ours.resolve({}), raw)
    assert np.array_equal(native.tensors["pixel_values"], plain.tensors["pixel_values"])


def variant(model, dest, **settings):
    """The model dir with other image-processor settings, in both files that hold them."""
    shutil.copytree(model, dest)
    flat = dest / "preprocessor_config.json"
    flat.write_text(json.dumps({**json.loads(flat.read_text()), **settings}))
    nested = json.loads((dest / "processor_config.json").read_text())
    nested["image_processor"].update(settings)
    (dest / "processor_config.json").write_text(json.dumps(nested))
    return dest


@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float"])
def test_per_channel_mean_and_std_match_transformers(model, tmp_path, raw):
    from transformers import AutoProcessor

    clip = {"image_mean": [0.48, 0.46, 0.41], "image_std": [0.27, 0.26, 0.28]}
    path = variant(model, tmp_path / "clip", **clip)
    ours = load_processor(path)
    assert ours._pairs is not None and len(ours._pairs) == 3  # a table per channel
    check(AutoProcessor.from_pretrained(path), ours, [IMAGES[n] for n in MIXED], raw)


def test_one_pixel_at_a_time_equals_pairs(ours):
    images = [np.asarray(IMAGES[n]) for n in MIXED]
    pairs = ours.process(images, ours.resolve({}), raw_pixels=False)
    single = Llama4Processor(ours.settings, ours.ids)
    single._pairs = None  # as on a big-endian machine, or for an odd tile size
    alone = single.process(images, ours.resolve({}), raw_pixels=False)
    assert np.array_equal(pairs.tensors["pixel_values"], alone.tensors["pixel_values"])


def test_neither_rescale_nor_normalize_keeps_uint8(model, tmp_path):
    from transformers import AutoProcessor

    path = variant(model, tmp_path / "raw", do_rescale=False, do_normalize=False)
    check(AutoProcessor.from_pretrained(path), load_processor(path), [IMAGES["wide"]], True)
    got = load_processor(path).process([np.asarray(IMAGES["wide"])], Llama4Tiling(16, False), False)
    assert got.tensors["pixel_values"].dtype == np.uint8


@pytest.fixture(scope="module")
def vllm_processor(model):
    """vLLM's own multimodal processor for the model (Mllama4MultiModalProcessor), offline."""
    from vllm.config import ModelConfig
    from vllm.multimodal import MULTIMODAL_REGISTRY

    return MULTIMODAL_REGISTRY.create_processor(ModelConfig(model=str(model), max_model_len=8192))


@pytest.mark.parametrize("kwargs", [{}, {"resize_to_max_canvas": True}], ids=["default", "max"])
def test_prompt_and_tensors_are_vllms(hf, ours, vllm_processor, kwargs):
    """vLLM's processor on the same prompt and images: the same expanded ids, placeholder
    ranges, embedding positions, aspect ratios, tile counts and pixels."""
    from vllm.multimodal.processing.context import TimingContext
    from vllm.multimodal.processing.inputs import ProcessorInputs

    images = [IMAGES[n] for n in MIXED]
    unexpanded = hf.tokenizer(chat_text(hf, len(images)))["input_ids"]
    items = vllm_processor.info.parse_mm_data({"image": images})
    inputs = ProcessorInputs(prompt=unexpanded, mm_data_items=items, hf_processor_mm_kwargs=kwargs)
    theirs = vllm_processor.apply(inputs, TimingContext())
    got = ours.process([np.asarray(i) for i in images], ours.resolve(kwargs), raw_pixels=False)
    placeholders = Placeholders("image", ours.anchor_token_id, got.replacements)
    ids, (ranges,) = expand(unexpanded, [placeholders])
    assert ids == theirs["prompt_token_ids"]
    vllm_ranges = theirs["mm_placeholders"]["image"]
    assert ranges == [(r.offset, r.length) for r in vllm_ranges]
    for (offset, length), r in zip(ranges, vllm_ranges):
        mask = [t == got.embed_token_id for t in ids[offset : offset + length]]
        assert mask == r.is_embed.tolist()
    pixels = np.split(got.tensors["pixel_values"], np.cumsum(got.tensors["patches_per_image"])[:-1])
    for i, item in enumerate(theirs["mm_kwargs"]["image"]):
        assert item["aspect_ratios"].data.tolist() == got.tensors["aspect_ratios"][i].tolist()
        assert int(item["patches_per_image"].data) == got.tensors["patches_per_image"][i]
        assert np.array_equal(item["pixel_values"].data.float().numpy(), pixels[i])


def test_tokens_per_tile_is_vllms(model, ours):
    from transformers import AutoConfig
    from vllm.model_executor.models.mllama4 import Mllama4ProcessingInfo

    vision = AutoConfig.from_pretrained(model).vision_config
    assert ours.settings.tokens_per_tile == Mllama4ProcessingInfo.get_patch_per_chunk(vision) == 144


def test_families_are_told_apart(model, ours):
    from types import SimpleNamespace

    from multimodal.registry import FAMILIES

    assert type(ours) is Llama4Processor
    assert ours.placeholder_text == IMAGE
    llama4_files = SimpleNamespace(
        config={"model_type": "llama4"},
        preprocessor={"image_processor_type": "Llama4ImageProcessorFast"},
        video_preprocessor={},
        vocab={},
    )
    assert [f for f in FAMILIES if f.matches(llama4_files)] == [Llama4Processor]
    for config, pre in [
        ({"model_type": "llama4_text"}, {}),  # text-only Llama 4
        ({"model_type": "llava"}, {"image_processor_type": "CLIPImageProcessor"}),
        ({"model_type": "qwen2_vl"}, {}),
        ({"model_type": "llama4"}, {"image_processor_type": "SiglipImageProcessor"}),
    ]:
        files = SimpleNamespace(config=config, preprocessor=pre, video_preprocessor={}, vocab={})
        assert not Llama4Processor.matches(files)
