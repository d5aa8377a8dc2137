"""GLM-4.1V / 4.5V / 4.6V preprocessing against transformers' Glm4vProcessor and
Glm46VProcessor (their image processors run on the torchvision backend, transformers 5's
default, which vLLM runs) and against vLLM's own Glm4vMultiModalProcessor run offline on the
same model dirs (no engine).

The model dirs are tests/support/glm4v_models.py's, without weights, one per model_type
(`glm4v`, `glm4v_moe`, `glm46v`), with the released pixel bounds (112^2 .. 9,633,792).
Pixels: uint8 identical with rescale and normalize off, float32 within 1e-5 (in practice
identical); token ids, grids and placeholder ranges identical.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from multimodal.decode import decode_pixels
from multimodal.pipeline import PixelEncoding, prepare
from multimodal.policy import MediaPolicy
from multimodal.processors import qwen_vl
from multimodal.processors.base import ModelConfigError, OptionError
from multimodal.processors.glm4v import Glm4vProcessor
from multimodal.processors.qwen_vl import QwenVLResize
from multimodal.prompt import Placeholders, expand
from tests.support import IMAGES_DIR, load_processor
from tests.support.glm4v_models import PREPROCESSOR, VARIANTS, build_model
from tests.support.synthetic_images import IMAGES

COMMITTED = sorted(IMAGES_DIR.glob("*.[jp][pn]g"))
MIXED = ["tall", "large", "tiny", "odd", "very thin"]
RELEASED = PREPROCESSOR["size"]
# Each changes some of the MIXED images' grids; the last has its minimum above its maximum,
# which transformers (and so vLLM) takes.
OPTIONS = [
    {},
    {"size": {"shortest_edge": 28 * 28 * 2, "longest_edge": 28 * 28 * 2 * 16}},
    {"size": {"shortest_edge": 28 * 28 * 2 * 300, "longest_edge": RELEASED["longest_edge"]}},
    {"size": {"shortest_edge": 28 * 28 * 2 * 64, "longest_edge": 28 * 28 * 2 * 8}},
]


def option_id(options: dict) -> str:
    size = options.get("size")
    return "default" if size is None else f"{size['shortest_edge']}-{size['longest_edge']}"


@pytest.fixture(scope="module", params=VARIANTS)
def model(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param) / "model"
    return build_model(out, request.param, weights=False, tiny=False)


@pytest.fixture(scope="module")
def hf(model):
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(model)
    kind = json.loads((model / "preprocessor_config.json").read_text())["image_processor_type"]
    assert type(processor.image_processor).__name__ == kind
    # The torchvision backend (transformers 5's default), which vLLM runs.
    assert type(processor.image_processor).__mro__[1].__name__ == "TorchvisionBackend"
    return processor


@pytest.fixture(scope="module")
def ours(model) -> Glm4vProcessor:
    processor = load_processor(model)
    assert type(processor) is Glm4vProcessor
    return processor


def chat_text(hf, count: int) -> str:
    content = [{"type": "image"} for _ in range(count)] + [{"type": "text", "text": "hi"}]
    return hf.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
    )


def expanded(ours, unexpanded: list[int], replacements) -> tuple[list[int], list]:
    ids, (ranges,) = expand(unexpanded, [Placeholders("image", ours.anchor_token_id, replacements)])
    return ids, ranges


def check(hf, ours, images, raw: bool, hf_images=None, **kwargs):
    """Ours against transformers' processor on the same chat prompt; returns ours."""
    text = chat_text(hf, len(images))
    extra = {"do_rescale": False, "do_normalize": False} if raw else {}
    out = hf(text=[text], images=hf_images or images, return_tensors="np", **extra, **kwargs)
    got = ours.process([np.asarray(i) for i in images], ours.resolve(kwargs), raw_pixels=raw)
    assert np.array_equal(got.tensors["image_grid_thw"], out["image_grid_thw"])
    want, have = out["pixel_values"], got.tensors["pixel_values"]
    assert have.shape == want.shape
    # transformers leaves pixels uint8 with do_rescale/do_normalize off: what vLLM sends.
    assert have.dtype == want.dtype == (np.uint8 if raw else np.float32)
    diff = np.abs(have.astype(np.float64) - want.astype(np.float64))
    assert diff.max() <= (0 if raw else 1e-5), f"max abs diff {diff.max()}"
    sizes = got.tensors["patches_per_image"]
    assert sizes.tolist() == out["image_grid_thw"].prod(1).tolist()
    ids, ranges = expanded(ours, hf.tokenizer(text)["input_ids"], got.replacements)
    assert ids == out["input_ids"][0].tolist()
    begin, end = (
        hf.tokenizer.convert_tokens_to_ids(t) for t in ("<|begin_of_image|>", "<|end_of_image|>")
    )
    for (offset, length), patches in zip(ranges, sizes.tolist()):
        assert length == patches // 4
        assert ids[offset : offset + length] == [ours.anchor_token_id] * length
        assert (ids[offset - 1], ids[offset + length]) == (begin, end)
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
@pytest.mark.parametrize("options", OPTIONS, ids=option_id)
def test_several_mixed_images_and_each_option_match_transformers(hf, ours, options, raw):
    got = check(hf, ours, [IMAGES[n] for n in MIXED], raw, **options)
    assert got.batched_keys == ("image_grid_thw", "patches_per_image")
    assert got.flat_keys == {"pixel_values": "patches_per_image"}


def test_the_options_change_the_grids(ours):
    images = [np.asarray(IMAGES[n]) for n in MIXED]  # 90x400 1280x960 10x12 333x177 600x8
    grids = [
        ours.process(images, ours.resolve(o), raw_pixels=True).tensors["image_grid_thw"].tolist()
        for o in OPTIONS
    ]
    assert len({json.dumps(g) for g in grids}) == len(OPTIONS)
    assert grids[0][1] == [1, 68, 92]  # 1280x960 within the released bounds: 952x1288


@pytest.fixture(scope="module")
def vllm_processors(model):
    """vLLM's processor on the model dir, as its engines run it: normalizing on device (its
    default for GLM, uint8 pixels) and not."""
    from vllm.config import ModelConfig
    from vllm.multimodal import MULTIMODAL_REGISTRY

    def make(device_normalizes: bool):
        config = ModelConfig(
            model=str(model),
            max_model_len=4096,
            dtype="float32",
            mm_device_do_normalize=device_normalizes,
        )
        assert config.get_multimodal_config().mm_device_do_normalize is device_normalizes
        return MULTIMODAL_REGISTRY.create_processor(config)

    return {True: make(True), False: make(False)}


def vllm_apply(vllm_processor, unexpanded: list[int], images, options: dict):
    from vllm.multimodal.processing.context import TimingContext
    from vllm.multimodal.processing.inputs import ProcessorInputs

    items = vllm_processor.info.parse_mm_data({"image": list(images)})
    inputs = ProcessorInputs(unexpanded, items, hf_processor_mm_kwargs=options)
    return vllm_processor.apply(inputs, TimingContext(enabled=False))


@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float"])
@pytest.mark.parametrize("options", OPTIONS, ids=option_id)
def test_ids_ranges_and_tensors_equal_vllm_s_own_processor(hf, ours, vllm_processors, options, raw):
    images = [IMAGES[n] for n in MIXED]
    unexpanded = hf.tokenizer(chat_text(hf, len(images)))["input_ids"]
    theirs = vllm_apply(vllm_processors[raw], unexpanded, images, options)
    got = ours.process([np.asarray(i) for i in images], ours.resolve(options), raw_pixels=raw)
    ids, ranges = expanded(ours, unexpanded, got.replacements)
    assert ids == theirs["prompt_token_ids"]
    assert ranges == [(p.offset, p.length) for p in theirs["mm_placeholders"]["image"]]
    data = theirs["mm_kwargs"].get_data()
    assert got.tensors["image_grid_thw"].tolist() == data["image_grid_thw"].tolist()
    pixels = data["pixel_values"].numpy()
    assert got.tensors["pixel_values"].dtype == pixels.dtype == (np.uint8 if raw else np.float32)
    assert np.abs(got.tensors["pixel_values"].astype(np.float64) - pixels).max() <= (
        0 if raw else 1e-5
    )


def test_the_pipeline_expands_the_prompt(hf, ours):
    unexpanded = hf.tokenizer(chat_text(hf, 2))["input_ids"]
    images = [np.asarray(IMAGES["square"]), np.asarray(IMAGES["tiny"])]
    got = ours.process(images, ours.resolve({}), raw_pixels=True)
    want_ids, want_ranges = expanded(ours, unexpanded, got.replacements)
    # Stand-ins for multimodal.media.LoadedImage: what the pipeline reads of an item.
    items = [SimpleNamespace(data=b"%d" % i, pixels=p) for i, p in enumerate(images)]
    prepared = prepare([(ours, items)], unexpanded, {}, PixelEncoding(raw=True))
    assert prepared.prompt_ids == want_ids
    assert prepared.parts[0].ranges == want_ranges
    (mm,) = prepared.mm_inputs
    assert list(mm.flat_keys.items()) == [("pixel_values", "patches_per_image")]


def sizes_to_resize():
    rng = np.random.default_rng(0)
    sizes = [
        (h, w)
        for h in (1, 2, 5, 9, 13, 14, 27, 28, 29, 55, 56, 57, 100, 333, 1000, 2999)
        for w in (1, 3, 8, 10, 27, 28, 42, 300, 1024, 5000)
    ]
    return sizes + [tuple(int(x) for x in rng.integers(1, 4000, 2)) for _ in range(400)]


BOUNDS = [
    (RELEASED["shortest_edge"], RELEASED["longest_edge"]),
    (112 * 112, 28 * 28 * 15000),  # the image processor's own default
    (28 * 28 * 2, 28 * 28 * 2 * 16),
    (28 * 28 * 2 * 300, 28 * 28 * 2 * 8),
]


def test_the_resize_rule_is_transformers_glm4v_smart_resize(ours):
    """On many sizes (tiny ones scaled up first, thin ones refused past 200:1) and bounds,
    the size ours resizes to is transformers' glm4v smart_resize's; Qwen's rule on the same
    numbers differs, so the comparison can fail."""
    from transformers.models.glm4v.image_processing_glm4v import smart_resize

    differs = 0
    for least, most in BOUNDS:
        bounds = QwenVLResize(least, most)
        for h, w in sizes_to_resize():
            try:
                want = smart_resize(
                    2, h, w, temporal_factor=2, factor=28, min_pixels=least, max_pixels=most
                )
            except ValueError:
                with pytest.raises(OptionError, match="aspect ratio"):
                    ours.target_size(h, w, bounds)
                continue
            assert ours.target_size(h, w, bounds) == want, (h, w, least, most)
            try:
                differs += qwen_vl.smart_resize(h, w, 28, least, most) != want
            except OptionError:
                differs += 1
    assert differs > 1000


@pytest.mark.parametrize(
    "options",
    [
        {"size": {"longest_edge": 28 * 28 * 16}},
        {"size": {"shortest_edge": 28 * 28}},
        {"size": {"shortest_edge": 0, "longest_edge": 28 * 28}},
        {"size": {"shortest_edge": 28 * 28, "longest_edge": "many"}},
        {"size": 1000},
        {"max_pixels": 28 * 28 * 16},  # Qwen's names: transformers ignores them for GLM
        {"min_pixels": 28 * 28},
        {"do_resize": False},
        {"patch_size": 16},
    ],
)
def test_bad_options_are_refused(ours, options):
    with pytest.raises(OptionError) as refused:
        ours.resolve(options)
    assert refused.value.status == 400 and "mm_processor_kwargs" in str(refused.value)


def test_settings_are_the_bounds_a_request_resizes_within(ours):
    assert ours.resolve({}) == QwenVLResize(RELEASED["shortest_edge"], RELEASED["longest_edge"])
    assert ours.resolve({"size": {"shortest_edge": 5, "longest_edge": 9}}) == QwenVLResize(5, 9)
    assert ours.family == "glm4v" and ours.anchor_token_id == ours.settings.image_token_id
    assert ours.placeholder_text == "<|begin_of_image|><|image|><|end_of_image|>"


@pytest.mark.parametrize(
    "change", [{"resample": 2}, {"do_normalize": False}, {"do_rescale": False}]
)
def test_configs_the_kernel_cannot_reproduce_are_refused(model, tmp_path, change):
    import shutil

    copy = tmp_path / "model"
    shutil.copytree(model, copy)
    path = copy / "preprocessor_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    with pytest.raises(ModelConfigError):
        load_processor(copy)


def test_qwen_and_glm_models_each_get_their_own_family():
    def files(model_type: str, kind: str) -> SimpleNamespace:
        return SimpleNamespace(
            config={"model_type": model_type}, preprocessor={"image_processor_type": kind}
        )

    assert not Glm4vProcessor.matches(files("qwen2_vl", "Qwen2VLImageProcessorFast"))
    assert not qwen_vl.QwenVLProcessor.matches(files("glm4v", "Glm4vImageProcessor"))
    assert Glm4vProcessor.matches(files("glm4v_moe", "Glm46VImageProcessorFast"))
    # GLM-OCR's model_type is its own, with the Glm46V image processor: not this family yet.
    assert not Glm4vProcessor.matches(files("glm_ocr", "Glm46VImageProcessor"))
