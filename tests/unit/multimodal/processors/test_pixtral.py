"""Mistral 3 and HF-format Pixtral preprocessing against transformers' PixtralProcessor
(torchvision backend, the default in transformers 5, which vLLM runs) and vLLM's own token
counting for the two model classes, offline on weightless model dirs (no engine).

Pixels: uint8 identical with rescale and normalize off; float32 within 1e-5 (identical in
practice). Token ids after expanding the unexpanded chat prompt equal transformers' input_ids;
`image_sizes` equal transformers'; the grids equal vLLM's `get_patch_grid_size`.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from multimodal.decode import decode_pixels
from multimodal.errors import MediaError
from multimodal.policy import MediaPolicy
from multimodal.processors.base import ModelConfigError, OptionError
from multimodal.processors.options import NoOptions
from multimodal.processors.pixtral import (
    Mistral3Processor,
    PixtralHFProcessor,
    PixtralResize,
    PixtralSize,
    image_tokens,
    resized_size,
)
from multimodal.prompt import Placeholders, expand
from tests.support import IMAGES_DIR, load_processor
from tests.support.pixtral_models import IMAGE, IMAGE_BREAK, IMAGE_END, build_model
from tests.support.synthetic_images import IMAGES

COMMITTED = sorted(IMAGES_DIR.glob("*.[jp][pn]g"))
MIXED = ["tall", "large", "tiny", "odd", "very thin"]
KINDS = ("mistral3", "pixtral")


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    return {k: build_model(tmp_path_factory.mktemp(k) / "model", False, k) for k in KINDS}


@pytest.fixture(scope="module")
def models(dirs):
    from transformers import AutoProcessor

    return {k: (AutoProcessor.from_pretrained(d), load_processor(d)) for k, d in dirs.items()}


def chat_text(hf, count: int) -> str:
    content = [{"type": "image"} for _ in range(count)] + [{"type": "text", "text": "hi"}]
    return hf.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
    )


def check(hf, ours, images, raw: bool, hf_images=None, **kwargs):
    """Our tensors and expanded ids against transformers' for `images` (HxWx3 uint8), with
    `kwargs` as the request's mm_processor_kwargs (passed to transformers as they are)."""
    text = chat_text(hf, len(images))
    extra = {"do_rescale": False, "do_normalize": False} if raw else {}
    out = hf(text=[text], images=hf_images or images, return_tensors="np", **extra, **kwargs)
    got = ours.process(images, ours.resolve(kwargs), raw_pixels=raw)
    want, have = out["pixel_values"], got.tensors["pixel_values"]
    assert have.shape == want.shape
    assert have.dtype == want.dtype == (np.uint8 if raw else np.float32)
    diff = np.abs(have.astype(np.float64) - want.astype(np.float64))
    assert diff.max() <= (0 if raw else 1e-5), f"max abs diff {diff.max()}"
    assert got.tensors["image_sizes"].dtype == out["image_sizes"].dtype
    assert np.array_equal(got.tensors["image_sizes"], out["image_sizes"])
    placeholders = Placeholders("image", ours.anchor_token_id, got.replacements)
    ids, (ranges,) = expand(hf.tokenizer(text)["input_ids"], [placeholders])
    assert ids == [int(i) for i in out["input_ids"][0]]
    vocab = hf.tokenizer.get_vocab()
    assert got.embed_token_id == ours.anchor_token_id == vocab[IMAGE]
    for (offset, length), (h, w) in zip(ranges, got.tensors["image_sizes"].tolist()):
        span = ids[offset : offset + length]
        side = ours.settings.token_pixels
        assert span.count(vocab[IMAGE]) == (h // side) * (w // side)
        assert span.count(vocab[IMAGE_BREAK]) == h // side - 1
        assert span[-1] == vocab[IMAGE_END]
    return got


@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float"])
@pytest.mark.parametrize("name", IMAGES)
@pytest.mark.parametrize("kind", KINDS)
def test_one_image_matches_transformers(models, kind, name, raw):
    hf, ours = models[kind]
    got = check(hf, ours, [np.asarray(IMAGES[name])], raw)
    assert got.batched_keys == ("pixel_values", "image_sizes")
    assert got.flat_keys == {}
    assert got.keep_on_cpu_keys == ("image_sizes",)


@pytest.fixture(scope="module")
def vllm_decode():
    from vllm.multimodal.media import ImageMediaIO

    return lambda data: ImageMediaIO().load_bytes(data).media


@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float"])
@pytest.mark.parametrize("path", COMMITTED, ids=[p.stem for p in COMMITTED])
@pytest.mark.parametrize("kind", KINDS)
def test_committed_image_matches_vllm_then_transformers(models, vllm_decode, kind, path, raw):
    """Bytes to tensors: the gateway's decode then ours, vLLM's decode then transformers'."""
    hf, ours = models[kind]
    data = path.read_bytes()
    pixels = np.asarray(decode_pixels(data, MediaPolicy())[0])
    check(hf, ours, [pixels], raw, hf_images=[vllm_decode(data)])


@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float"])
@pytest.mark.parametrize("kind", KINDS)
def test_several_images_of_different_sizes_are_a_ragged_batch(models, kind, raw):
    hf, ours = models[kind]
    got = check(hf, ours, [np.asarray(IMAGES[n]) for n in MIXED], raw)
    # transformers' zero-padded batch, and how the worker cuts it back per image
    assert got.batched_keys == ("image_sizes",)
    assert got.flat_keys == {"pixel_values": "image_sizes"}


@pytest.mark.parametrize("kind", KINDS)
def test_images_of_one_size_are_a_plain_batch(models, kind):
    hf, ours = models[kind]
    images = [np.asarray(IMAGES["square"]), np.asarray(IMAGES["square"])[::-1].copy()]
    got = check(hf, ours, images, raw=True)
    assert got.batched_keys == ("pixel_values", "image_sizes")
    assert got.flat_keys == {}


@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float"])
@pytest.mark.parametrize("longest", [1, 28, 100, 280, 2048])
def test_the_size_option_matches_transformers(models, longest, raw):
    hf, ours = models["mistral3"]
    options = {"size": {"longest_edge": longest}}
    assert ours.resolve(options) == PixtralResize(longest)
    images = [np.asarray(IMAGES[n]) for n in ("large", "odd", "tall")]
    if longest < 28:
        with pytest.raises(MediaError, match="too thin"):  # transformers fails on it too
            ours.process(images, ours.resolve(options), raw_pixels=raw)
        return
    check(hf, ours, images, raw, **options)


def test_options_are_checked(models):
    _, ours = models["mistral3"]
    assert ours.resolve({}) == ours.resolve({"size": {}}) == PixtralResize(1540)
    assert ours.options().size is None and PixtralSize().longest_edge is None
    for bad, message in [
        ({"longest_edge": 100}, "unsupported mm_processor_kwargs"),
        ({"patch_size": 16}, "unsupported mm_processor_kwargs"),
        ({"size": {"height": 100}}, r"unsupported mm_processor_kwargs.size \['height'\]"),
        ({"size": {"longest_edge": 0}}, "must be a positive integer"),
        ({"size": {"longest_edge": "1"}}, "must be a positive integer"),
        ({"size": 100}, "size must be an object"),
    ]:
        with pytest.raises(OptionError, match=message):
            ours.resolve(bad)


def test_pixtral_hf_takes_no_option(models):
    """vLLM counts Pixtral-HF's tokens from the tower's image_size whatever a request asks."""
    _, ours = models["pixtral"]
    assert ours.options is NoOptions
    assert ours.resolve({}) == PixtralResize(1024)
    with pytest.raises(OptionError, match="accepted: none"):
        ours.resolve({"size": {"longest_edge": 512}})


def test_a_too_thin_image_is_refused_with_its_index(models):
    _, ours = models["mistral3"]
    with pytest.raises(MediaError, match="image 1: a 5000x1 image is too thin"):
        ours.process(
            [np.zeros((9, 9, 3), np.uint8), np.zeros((1, 5000, 3), np.uint8)],
            ours.resolve({}),
            True,
        )


def sizes_to_count():
    rng = np.random.default_rng(0)
    sizes = [
        (h, w)
        for h in (1, 2, 13, 14, 15, 27, 28, 29, 1024, 1539, 1540, 1541)
        for w in (3, 28, 333, 1540, 4000)
    ]
    sizes += [tuple(int(x) for x in rng.integers(1, 5000, 2)) for _ in range(500)]
    return [(h, w) for h, w in sizes if max(h, w) / min(h, w) < 100]


def vllm_grid(kind, config, longest):
    from vllm.model_executor.models.mistral3 import Mistral3HFEncoderInfo
    from vllm.model_executor.models.pixtral import PixtralHFEncoderInfo

    info = (
        Mistral3HFEncoderInfo(config, longest)
        if kind == "mistral3"
        else PixtralHFEncoderInfo(config)
    )
    return lambda h, w: info.get_patch_grid_size(image_width=w, image_height=h)[::-1]


@pytest.mark.parametrize(
    ("kind", "longest"),
    [("mistral3", None), ("mistral3", 280), ("mistral3", 1000), ("pixtral", None)],
)
def test_grids_are_vllm_s_and_transformers(models, dirs, kind, longest):
    """Rows and columns of tokens: ours, vLLM's get_patch_grid_size (from the original size, as
    its prompt replacement does) and transformers' count, on many sizes."""
    from transformers import AutoConfig

    hf, ours = models[kind]
    resize = ours.resolve({"size": {"longest_edge": longest}} if longest else {})
    sizes = sizes_to_count()
    grids = [ours.grid(h, w, resize) for h, w in sizes]
    vllm = vllm_grid(kind, AutoConfig.from_pretrained(dirs[kind]), resize.longest_edge)
    assert grids == [vllm(h, w) for h, w in sizes]
    # transformers counts on a zeros((h, w, 3)) array, whose channels it misreads when h is 1
    # or 3: leave those out of its comparison.
    clear = [i for i, (h, w) in enumerate(sizes) if h not in (1, 3)]
    extra = {"size": {"longest_edge": longest}} if longest else {}
    counts = hf._get_num_multimodal_tokens(image_sizes=[sizes[i] for i in clear], **extra)
    assert [grids[i][0] * (grids[i][1] + 1) for i in clear] == counts["num_image_tokens"]
    # vLLM's slot check sizes the rule from the resized image (`image_sizes`): the same grid
    side = ours.settings.token_pixels
    resized = [resized_size(h, w, resize.longest_edge, side) for h, w in sizes]
    assert [vllm(h, w) for h, w in resized] == grids


def test_replacement_is_vllm_s():
    assert image_tokens(2, 3, 7, 8, 9) == [7, 7, 7, 8, 7, 7, 7, 9]
    assert image_tokens(1, 1, 7, 8, 9) == [7, 9]


def test_families_are_told_apart(models):
    from types import SimpleNamespace

    from multimodal.processors.llava import LlavaProcessor

    assert type(models["mistral3"][1]) is Mistral3Processor
    assert type(models["pixtral"][1]) is PixtralHFProcessor
    assert (Mistral3Processor.placeholder_text, PixtralHFProcessor.placeholder_text) == (
        "",
        "<image>",
    )
    pixtral = {"image_processor_type": "PixtralImageProcessor"}
    for config, pre, m3, hf_pixtral, llava in [
        ({"model_type": "mistral3"}, pixtral, True, False, False),
        ({"model_type": "mistral3"}, {}, True, False, False),
        (
            {"model_type": "llava", "vision_config": {"model_type": "pixtral"}},
            pixtral,
            False,
            True,
            False,
        ),
        (
            {"model_type": "llava", "vision_config": {"model_type": "pixtral"}},
            {},
            False,
            False,
            False,
        ),
        (
            {"model_type": "llava", "vision_config": {"model_type": "clip_vision_model"}},
            {},
            False,
            False,
            True,
        ),
        (
            {"model_type": "llava"},
            {"image_processor_type": "CLIPImageProcessor"},
            False,
            False,
            True,
        ),
        ({"model_type": "llava"}, pixtral, False, False, False),  # a CLIP tower: nobody
        ({"model_type": "qwen2_vl"}, pixtral, False, False, False),
    ]:
        files = SimpleNamespace(config=config, preprocessor=pre, video_preprocessor={}, vocab={})
        assert Mistral3Processor.matches(files) == m3
        assert PixtralHFProcessor.matches(files) == hf_pixtral
        assert LlavaProcessor.matches(files) == llava


def test_nested_processor_config_reads_the_same(dirs, tmp_path):
    """transformers 5's processor_config.json alone (no flat preprocessor_config.json)."""
    nested = shutil.copytree(dirs["mistral3"], tmp_path / "nested")
    (nested / "preprocessor_config.json").unlink()
    assert "image_processor" in json.loads((nested / "processor_config.json").read_text())
    a, b = load_processor(dirs["mistral3"]), load_processor(nested)
    assert (a.settings, a.pixels.settings) == (b.settings, b.pixels.settings)


def test_a_tower_that_disagrees_with_the_processor_is_refused(dirs, tmp_path):
    model = shutil.copytree(dirs["pixtral"], tmp_path / "odd")
    config = json.loads((model / "config.json").read_text())
    config["vision_config"]["image_size"] = 512
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelConfigError, match="vLLM's token count"):
        load_processor(model)


def test_the_worker_cuts_a_ragged_batch_back_per_image(models):
    """The wire layout of a ragged batch, decoded by the worker: every image its own [3, h, w]
    tensor, as vLLM's processor hands them to the model."""
    import torch

    from engine_server.mm_inputs import PixelContract, build_mm_prompt
    from multimodal.wire import multimodal_inputs
    from protos import common_pb2

    _, ours = models["mistral3"]
    images = [np.asarray(IMAGES[n]) for n in ("tall", "tiny", "odd")]
    got = ours.process(images, ours.resolve({}), raw_pixels=True)
    ids = [1]
    ranges = []
    for tokens in got.replacements:
        ranges.append((len(ids), len(tokens)))
        ids += tokens
    mm = multimodal_inputs(got, ranges, ["a", "b", "c"], None, "image")
    assert mm.modality == common_pb2.IMAGE
    prompt = build_mm_prompt(ids, [mm], PixelContract(True, torch.float32))
    items = prompt["mm_kwargs"]["image"]
    for item, (h, w), padded in zip(
        items, got.tensors["image_sizes"].tolist(), got.tensors["pixel_values"]
    ):
        assert tuple(item["pixel_values"].data.shape) == (3, h, w)
        assert np.array_equal(item["pixel_values"].data.numpy(), padded[:, :h, :w])
    assert [p.get_num_embeds() for p in prompt["mm_placeholders"]["image"]] == [
        t.count(ours.anchor_token_id) for t in got.replacements
    ]
