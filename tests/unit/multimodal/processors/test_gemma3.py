"""Gemma 3 preprocessing against transformers' Gemma3Processor (its Gemma3ImageProcessor runs on
the torchvision backend, the default in transformers 5, which vLLM runs) and against vLLM's own
Gemma3MultiModalProcessor, run offline on the same model dir (no engine).

The model dir is the tiny Gemma 3 of tests/support/gemma3_models.py without weights (released
896x896 preprocessor config, 64 tokens per image). Pixels: uint8 identical with rescale and
normalize off, float32 within 1e-5 (in practice identical). Token ids: our expansion plus
vLLM's newline fusion (`finish_prompt`) equals transformers' input_ids and vLLM's prompt ids;
placeholder ranges equal vLLM's, but for the last token shared by two images in a row.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from multimodal.decode import decode_pixels
from multimodal.pipeline import PixelEncoding, prepare
from multimodal.policy import MediaPolicy
from multimodal.processors import gemma3, transforms
from multimodal.processors.base import OptionError
from multimodal.processors.gemma3 import (
    DEFAULT_PAN_AND_SCAN,
    Gemma3Processor,
    PanAndScan,
    crop_grid,
    fuse_newlines,
)
from multimodal.prompt import Placeholders, expand
from tests.support import IMAGES_DIR, load_processor
from tests.support.gemma3_models import IMAGE_SEQ_LENGTH, build_model
from tests.support.synthetic_images import IMAGES

COMMITTED = sorted(IMAGES_DIR.glob("*.[jp][pn]g"))
MIXED = ["tall", "large", "tiny", "odd", "very thin"]
PAN_AND_SCAN = {"do_pan_and_scan": True}
# Every option, alone and together: each changes the crops of some of the MIXED images.
OPTIONS = [
    {},
    PAN_AND_SCAN,
    {**PAN_AND_SCAN, "pan_and_scan_min_crop_size": 64},
    {**PAN_AND_SCAN, "pan_and_scan_min_crop_size": 8, "pan_and_scan_max_num_crops": 2},
    {**PAN_AND_SCAN, "pan_and_scan_min_crop_size": 8, "pan_and_scan_min_ratio_to_activate": 3.0},
    {"pan_and_scan_min_crop_size": 8},  # pan-and-scan off: no crops whatever the others say
]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("gemma3") / "model", weights=False)


@pytest.fixture(scope="module")
def hf(model):
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(model)
    # The torchvision backend (transformers 5's default), which vLLM runs.
    assert type(processor.image_processor).__name__ == "Gemma3ImageProcessor"
    assert processor.image_processor.__class__.__mro__[1].__name__ == "TorchvisionBackend"
    return processor


@pytest.fixture(scope="module")
def ours(model) -> Gemma3Processor:
    return load_processor(model)


@pytest.fixture(scope="module")
def vllm_processor(model):
    """vLLM's Gemma3MultiModalProcessor on the model dir (float32, as the e2e engines run)."""
    from vllm.config import ModelConfig
    from vllm.multimodal import MULTIMODAL_REGISTRY

    config = ModelConfig(model=str(model), max_model_len=4096, dtype="float32")
    return MULTIMODAL_REGISTRY.create_processor(config)


def chat_text(hf, count: int) -> str:
    content = [{"type": "image"} for _ in range(count)] + [{"type": "text", "text": "hi"}]
    return hf.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
    )


def expanded(ours, unexpanded: list[int], replacements) -> tuple[list[int], list]:
    """The gateway's expansion, then the family's prompt finish (as multimodal.pipeline)."""
    ids, ranges = expand(unexpanded, [Placeholders("image", ours.anchor_token_id, replacements)])
    ids, (ranges,) = ours.finish_prompt(ids, ranges)
    return ids, ranges


def check(hf, ours, images, raw: bool, hf_images=None, **kwargs):
    """Ours against transformers' processor on the same chat prompt; returns ours."""
    text = chat_text(hf, len(images))
    extra = {"do_rescale": False, "do_normalize": False} if raw else {}
    out = hf(text=[text], images=hf_images or images, return_tensors="np", **extra, **kwargs)
    got = ours.process([np.asarray(i) for i in images], ours.resolve(kwargs), raw_pixels=raw)
    want, have = out["pixel_values"], got.tensors["pixel_values"]
    assert have.shape == want.shape
    # transformers leaves pixels uint8 with do_rescale/do_normalize off: what vLLM would send.
    assert have.dtype == want.dtype == (np.uint8 if raw else np.float32)
    diff = np.abs(have.astype(np.float64) - want.astype(np.float64))
    assert diff.max() <= (0 if raw else 1e-5), f"max abs diff {diff.max()}"
    # The processor drops the image processor's num_crops (unused_input_names): ask it.
    merged = {**_pan_and_scan_kwargs(DEFAULT_PAN_AND_SCAN), **kwargs}
    crops = hf.image_processor(images=hf_images or images, **merged)["num_crops"]
    sizes = got.tensors["num_patches"]
    assert sizes.dtype == np.int64 and sizes.tolist() == [c + 1 for c in crops]
    assert int(sizes.sum()) == have.shape[0]
    ids, ranges = expanded(ours, hf.tokenizer(text)["input_ids"], got.replacements)
    assert ids == out["input_ids"][0].tolist()
    soft = hf.tokenizer.convert_tokens_to_ids("<image_soft_token>")
    assert got.embed_token_id == soft
    for (offset, length), patches in zip(ranges, sizes.tolist()):
        assert ids[offset : offset + length].count(soft) == patches * IMAGE_SEQ_LENGTH
    return got


def _pan_and_scan_kwargs(pas: PanAndScan) -> dict:
    return {
        "do_pan_and_scan": pas.enabled,
        "pan_and_scan_min_crop_size": pas.min_crop_size,
        "pan_and_scan_max_num_crops": pas.max_num_crops,
        "pan_and_scan_min_ratio_to_activate": pas.min_ratio_to_activate,
    }


@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float"])
@pytest.mark.parametrize("name", IMAGES)
def test_one_image_matches_transformers(hf, ours, name, raw):
    got = check(hf, ours, [IMAGES[name]], raw)
    assert got.tensors["pixel_values"].shape == (1, 3, 896, 896)
    assert len(got.replacements[0]) == IMAGE_SEQ_LENGTH + 4  # \n\n <boi> ... <eoi> \n\n


@pytest.fixture(scope="module")
def vllm_decode():
    from vllm.multimodal.media import ImageMediaIO

    return lambda data: ImageMediaIO().load_bytes(data).media


@pytest.mark.parametrize("options", [{}, PAN_AND_SCAN], ids=["plain", "pan-and-scan"])
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
    got = check(hf, ours, [IMAGES[n] for n in MIXED], raw, **PAN_AND_SCAN)
    # 1280x960 gets 2 crops; the thin ones' would be under 256 px, 333x177 is not wide enough.
    assert got.tensors["num_patches"].tolist() == [1, 3, 1, 1, 1]
    assert got.batched_keys == got.keep_on_cpu_keys == ("num_patches",)
    assert got.flat_keys == {"pixel_values": "num_patches"}


@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float"])
@pytest.mark.parametrize(
    "options", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items())
)
def test_each_option_matches_transformers(hf, ours, options, raw):
    check(hf, ours, [IMAGES[n] for n in MIXED], raw, **options)


def test_the_options_change_the_crops(ours):
    images = [np.asarray(IMAGES[n]) for n in MIXED]  # 90x400 1280x960 10x12 333x177 600x8
    sizes = [
        ours.process(images, ours.resolve(o), raw_pixels=True).tensors["num_patches"].tolist()
        for o in OPTIONS
    ]
    assert sizes == [
        [1, 1, 1, 1, 1],
        [1, 3, 1, 1, 1],  # 2 crops of 640x960; the thin ones' would be under 256 px
        [5, 3, 1, 3, 1],  # 4 crops of 90x100 once 64 px will do
        [3, 3, 1, 3, 3],  # at most 2 crops
        [5, 1, 1, 1, 5],  # only ratios of 3 and more
        [1, 1, 1, 1, 1],
    ]


def vllm_apply(vllm_processor, unexpanded: list[int], images, options: dict):
    from vllm.multimodal.processing.context import TimingContext
    from vllm.multimodal.processing.inputs import ProcessorInputs

    items = vllm_processor.info.parse_mm_data({"image": list(images)})
    inputs = ProcessorInputs(unexpanded, items, hf_processor_mm_kwargs=options)
    return vllm_processor.apply(inputs, TimingContext(enabled=False))


@pytest.mark.parametrize(
    "options", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items())
)
def test_ids_ranges_and_tensors_equal_vllm_s_own_processor(hf, ours, vllm_processor, options):
    images = [IMAGES[n] for n in MIXED]
    unexpanded = hf.tokenizer(chat_text(hf, len(images)))["input_ids"]
    theirs = vllm_apply(vllm_processor, unexpanded, images, options)
    got = ours.process([np.asarray(i) for i in images], ours.resolve(options), raw_pixels=False)
    ids, ranges = expanded(ours, unexpanded, got.replacements)
    assert ids == theirs["prompt_token_ids"]
    data = theirs["mm_kwargs"].get_data()
    assert got.tensors["num_patches"].tolist() == data["num_patches"].tolist()
    assert np.abs(got.tensors["pixel_values"] - data["pixel_values"].numpy()).max() <= 1e-5
    vllm_ranges = [(p.offset, p.length) for p in theirs["mm_placeholders"]["image"]]
    assert [o for o, _ in ranges] == [o for o, _ in vllm_ranges]
    # vLLM's ranges of two images in a row share their fused "\n\n\n\n"; ours stop before it.
    ends = [o for o, _ in vllm_ranges[1:]] + [len(ids)]
    assert [n for _, n in ranges] == [min(n, end - o) for (o, n), end in zip(vllm_ranges, ends)]


def test_two_images_in_a_row_fuse_their_newlines(hf, ours):
    text = chat_text(hf, 2)  # "user\n<boi><boi>hi": "\n" + "\n\n", "\n\n" + "\n\n"
    unexpanded = hf.tokenizer(text)["input_ids"]
    got = ours.process([np.asarray(IMAGES["square"])] * 2, ours.resolve({}), raw_pixels=True)
    ids, ranges = expanded(ours, unexpanded, got.replacements)
    _, _, n3, n4 = (hf.tokenizer.convert_tokens_to_ids(t) for t in gemma3.NEWLINES)
    first, second = ranges
    assert ids[first[0]] == n3 and ids[second[0]] == n4
    assert first == (first[0], IMAGE_SEQ_LENGTH + 3) and second[1] == IMAGE_SEQ_LENGTH + 4
    assert len(ids) == len(unexpanded) - 2 + 2 * (IMAGE_SEQ_LENGTH + 4) - 2


def test_the_pipeline_finishes_the_prompt(hf, ours):
    unexpanded = hf.tokenizer(chat_text(hf, 2))["input_ids"]
    images = [np.asarray(IMAGES["square"]), np.asarray(IMAGES["wide"])]
    got = ours.process(images, ours.resolve({}), raw_pixels=True)
    want_ids, want_ranges = expanded(ours, unexpanded, got.replacements)
    # Stand-ins for multimodal.media.LoadedImage: what the pipeline reads of an item.
    items = [SimpleNamespace(data=b"%d" % i, pixels=p) for i, p in enumerate(images)]
    prepared = prepare([(ours, items)], unexpanded, {}, PixelEncoding(raw=True))
    assert prepared.prompt_ids == want_ids
    assert prepared.parts[0].ranges == want_ranges
    (mm,) = prepared.mm_inputs
    assert mm.im_token_id == ours.tokens.soft
    assert list(mm.flat_keys.items()) == [("pixel_values", "num_patches")]


def sizes_to_count():
    rng = np.random.default_rng(0)
    sizes = [
        (h, w)
        for h in (1, 2, 7, 100, 255, 256, 257, 511, 512, 513, 896, 1000)
        for w in (1, 3, 8, 300, 307, 308, 512, 600, 1024, 1500, 4000)
    ]
    sizes += [tuple(int(x) for x in rng.integers(1, 3000, 2)) for _ in range(300)]
    # Aspect ratios right at the activation ratio and at the rounding of the crop count.
    sizes += [(k * 5, k * 6) for k in range(1, 200, 7)]
    sizes += [(k * 2, k * 5) for k in range(1, 400, 11)]
    return sizes


@pytest.mark.parametrize("options", OPTIONS[1:], ids=lambda o: ",".join(f"{k}" for k in o))
def test_crop_counts_and_replacements_are_vllm_s(ours, vllm_processor, options):
    """Our crop count and replacement ids equal vLLM's get_num_crops and get_image_repl (which
    vLLM computes itself, from the image size) on many sizes."""
    info = vllm_processor.info
    hf_processor = info.get_hf_processor(**options)
    settings = ours.resolve(options)
    for h, w in sizes_to_count():
        count = ours.num_crops(h, w, settings)
        kw = {"image_width": w, "image_height": h, "processor": hf_processor, "mm_kwargs": options}
        assert count == info.get_num_crops(**kw), (h, w)
        repl = info.get_image_repl(**kw)
        assert ours.replacement(count) == repl.full, (h, w)
        soft = sum(t == ours.tokens.soft for t in ours.replacement(count))
        assert soft == info.get_num_image_tokens(**kw)


def test_crop_grid_follows_transformers_pan_and_scan(hf):
    import torch

    for h, w in sizes_to_count()[:150]:
        for pas in (PanAndScan(True, 8, 4, 1.2), PanAndScan(True, 64, 3, 1.5)):
            image = torch.zeros((1, 3, h, w), dtype=torch.uint8)
            crops = hf.image_processor.pan_and_scan_batched(
                image, pas.min_crop_size, pas.max_num_crops, pas.min_ratio_to_activate
            )
            rows, cols = crop_grid(h, w, pas)
            assert len(crops) == rows * cols
            if crops:
                windows = gemma3.crop_windows(h, w, rows, cols)
                assert [tuple(c.shape[-2:]) for c in crops] == [
                    (ch, cw) for _, _, ch, cw in windows
                ]


@pytest.mark.parametrize("native", [True, False], ids=["native", "numpy"])
def test_both_resize_paths_match(hf, ours, monkeypatch, native):
    monkeypatch.setattr(transforms.native, "AVAILABLE", native and transforms.native.AVAILABLE)
    for raw in (True, False):
        check(
            hf,
            ours,
            [IMAGES["large"], IMAGES["tall"]],
            raw,
            do_pan_and_scan=True,
            pan_and_scan_min_crop_size=32,
        )


def test_fuse_newlines_is_vllm_s_rule(ours):
    from vllm.multimodal.processing.processor import replace_token_matches

    n1, n2, n3, n4 = ours.tokens.newlines
    rng = np.random.default_rng(0)
    for _ in range(300):
        ids = [int(t) for t in rng.choice([n1, n2, n3, n4, 5, 6], size=rng.integers(0, 30))]
        want = replace_token_matches(ids, [n1, n2], [n3])
        want = replace_token_matches(want, [n2, n1], [n3])
        want = replace_token_matches(want, [n2, n2], [n4])
        assert fuse_newlines(ids, ours.tokens.newlines)[0] == want


def test_defaults_and_settings(ours):
    assert ours.resolve({}) is DEFAULT_PAN_AND_SCAN
    assert PanAndScan(False, 256, 4, 1.2) == DEFAULT_PAN_AND_SCAN
    assert ours.resolve({"do_pan_and_scan": True, "pan_and_scan_min_ratio_to_activate": 2}) == (
        PanAndScan(True, 256, 4, 2.0)
    )
    assert ours.placeholder_text == "<start_of_image>"
    assert ours.anchor_token_id == ours.tokens.boi


@pytest.mark.parametrize(
    "options, message",
    [
        ({"size": {"height": 448, "width": 448}}, "unsupported mm_processor_kwargs"),
        ({"do_resize": False}, "unsupported mm_processor_kwargs"),
        ({"do_pan_and_scan": "yes"}, "do_pan_and_scan must be true or false"),
        ({"pan_and_scan_min_crop_size": 0}, "min_crop_size must be a positive integer"),
        ({"pan_and_scan_max_num_crops": 1.5}, "max_num_crops must be a positive integer"),
        ({"pan_and_scan_min_ratio_to_activate": "2"}, "min_ratio_to_activate must be a number"),
    ],
)
def test_bad_options_are_refused(ours, options, message):
    with pytest.raises(OptionError, match=message):
        ours.resolve(options)


def test_an_empty_crop_is_refused(ours):
    # 1x5 in 4 crops of ceil(5/4) = 2 px: the 4th would start past the edge.
    settings = ours.resolve({**PAN_AND_SCAN, "pan_and_scan_min_crop_size": 1})
    with pytest.raises(OptionError, match="empty crop"):
        ours.process([np.zeros((1, 5, 3), np.uint8)], settings, raw_pixels=True)


def test_families_are_told_apart(ours):
    from multimodal.registry import FAMILIES

    assert type(ours) is Gemma3Processor
    gemma = {"model_type": "gemma3", "vision_config": {"model_type": "siglip_vision_model"}}
    for config, pre, expected in [
        (gemma, {"image_processor_type": "Gemma3ImageProcessor"}, True),
        (gemma, {"image_processor_type": "Gemma3ImageProcessorFast"}, True),
        (gemma, {}, True),
        # The same model_type with another image processor: not what this file reproduces.
        (gemma, {"image_processor_type": "SiglipImageProcessor"}, False),
        ({"model_type": "gemma3_text"}, {}, False),
        ({"model_type": "gemma3n"}, {"image_processor_type": "SiglipImageProcessor"}, False),
        ({"model_type": "paligemma"}, {"image_processor_type": "SiglipImageProcessor"}, False),
        ({"model_type": "llava"}, {"image_processor_type": "CLIPImageProcessor"}, False),
    ]:
        files = SimpleNamespace(config=config, preprocessor=pre, video_preprocessor={}, vocab={})
        assert Gemma3Processor.matches(files) == expected
        if config is gemma:  # and no other family claims a Gemma 3 model
            others = [f for f in FAMILIES if f is not Gemma3Processor and f.matches(files)]
            assert others == []


def test_transformers_5_nested_processor_config_reads_the_same(model, ours, tmp_path):
    import shutil

    nested = shutil.copytree(model, tmp_path / "nested")
    (nested / "preprocessor_config.json").unlink()  # processor_config.json's entry remains
    other = load_processor(nested)
    assert other.pixels.settings == ours.pixels.settings
    assert (other.tokens, other.tokens_per_image) == (ours.tokens, ours.tokens_per_image)
    assert other.replacement(2) == ours.replacement(2)
