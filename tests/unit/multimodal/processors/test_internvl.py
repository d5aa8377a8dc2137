"""InternVL (HF format) preprocessing against transformers' InternVLProcessor (torchvision
backend, transformers 5's default and what vLLM runs) and against vLLM's own processor for
the family (interns1.py), run offline: no engine, no subprocess.

The model dir is tests.support.internvl_models' (released preprocessor config: 448px tiles,
1..12 tiles plus a thumbnail), without weights.
"""

from __future__ import annotations

import numpy as np
import pytest

from multimodal.decode import decode_pixels
from multimodal.policy import MediaPolicy
from multimodal.processors.base import OptionError
from multimodal.processors.internvl import (
    MOST_PATCHES,
    SIZES_KEY,
    TOKEN_ID_KEY,
    InternVLProcessor,
    Tiling,
)
from multimodal.prompt import Placeholders, expand
from tests.support import IMAGES_DIR, load_processor
from tests.support.internvl_models import IMAGE_SEQ_LENGTH, build_model
from tests.support.synthetic_images import IMAGES

COMMITTED = sorted(IMAGES_DIR.glob("*.[jp][pn]g"))
# Each option alone and a few together, as a request's mm_processor_kwargs.
OPTIONS = {
    "no tiling": {"crop_to_patches": False},
    "tiling on": {"crop_to_patches": True},
    "at most 2": {"max_patches": 2},
    "at most 6": {"max_patches": 6},
    "at least 3": {"min_patches": 3},
    "3 to 4": {"min_patches": 3, "max_patches": 4},
    "min over max": {"min_patches": 5, "max_patches": 2},
    "one tile": {"max_patches": 1},
}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("internvl") / "model", weights=False)


@pytest.fixture(scope="module")
def hf(model):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(model)


@pytest.fixture(scope="module")
def ours(model) -> InternVLProcessor:
    return load_processor(model)


@pytest.fixture(scope="module")
def vllm_processor(model):
    """vLLM's multimodal processor for the model, as its renderer builds it (float32 pixels)."""
    from vllm.config import ModelConfig, VllmConfig
    from vllm.renderers import renderer_from_config

    config = ModelConfig(
        model=str(model), max_model_len=8192, dtype="float32", limit_mm_per_prompt={"image": 4}
    )
    return renderer_from_config(VllmConfig(model_config=config)).mm_processor


def chat_text(hf, count: int) -> str:
    content = [{"type": "image"} for _ in range(count)] + [{"type": "text", "text": "hi"}]
    return hf.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
    )


def check(hf, ours, images, raw: bool, options: dict | None = None, pixels=None):
    """Ours equals transformers' processor: expanded ids, tile counts, pixels."""
    options = options or {}
    text = chat_text(hf, len(images))
    extra = {"do_rescale": False, "do_normalize": False} if raw else {}
    out = hf(text=[text], images=images, return_tensors="np", **extra, **options)
    # The processor drops the per-image tile counts; its image processor counts them (given
    # the processor's crop_to_patches default).
    tiling = {"crop_to_patches": True, **options}
    counts = [
        hf.image_processor.get_number_of_image_patches(i.height, i.width, tiling) for i in images
    ]
    pixels = pixels or [np.asarray(i) for i in images]
    got = ours.process(pixels, ours.resolve(options), raw_pixels=raw)

    want, have = out["pixel_values"], got.tensors["pixel_values"]
    assert have.shape == want.shape
    assert have.dtype == want.dtype == (np.uint8 if raw else np.float32)
    if raw:
        assert np.array_equal(have, want)
    else:  # float32 differences of values this close are exact
        assert (diff := float(np.abs(have - want).max())) <= 1e-5, f"max abs diff {diff}"
    assert got.tensors[SIZES_KEY].dtype == np.int64
    assert got.tensors[SIZES_KEY].tolist() == counts

    placeholders = Placeholders("image", ours.anchor_token_id, got.replacements)
    ids, (ranges,) = expand(hf.tokenizer(text)["input_ids"], [placeholders])
    assert ids == [int(i) for i in out["input_ids"][0]]
    tokenizer = hf.tokenizer
    for (offset, length), tiles in zip(ranges, counts):
        run = ids[offset : offset + length]
        assert tokenizer.convert_ids_to_tokens([run[0], run[-1]]) == ["<img>", "</img>"]
        assert run[1:-1] == [got.embed_token_id] * (tiles * IMAGE_SEQ_LENGTH)
    return got


@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float"])
@pytest.mark.parametrize("path", COMMITTED, ids=[p.stem for p in COMMITTED])
def test_committed_image_matches_vllm_decode_then_transformers(hf, ours, path, raw):
    from vllm.multimodal.media import ImageMediaIO

    data = path.read_bytes()
    theirs = ImageMediaIO().load_bytes(data).media
    # The gateway's decode: libjpeg-turbo straight into an array for the JPEGs.
    pixels = [np.asarray(decode_pixels(data, MediaPolicy())[0])]
    check(hf, ours, [theirs], raw, pixels=pixels)


@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float"])
@pytest.mark.parametrize("name", IMAGES)
def test_synthetic_image_matches_transformers(hf, ours, name, raw):
    check(hf, ours, [IMAGES[name]], raw)


@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float"])
def test_several_images_in_one_request(hf, ours, raw):
    images = [IMAGES["tall"], IMAGES["large"], IMAGES["tiny"], IMAGES["odd"], IMAGES["square"]]
    got = check(hf, ours, images, raw)
    assert got.tensors[SIZES_KEY].tolist() == [5, 13, 13, 3, 1]
    assert got.tensors["pixel_values"].shape == (35, 3, 448, 448)


@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float"])
@pytest.mark.parametrize("option", OPTIONS)
def test_each_option_matches_transformers(hf, ours, option, raw):
    images = [IMAGES["wide"], IMAGES["large"], IMAGES["very thin"], IMAGES["square"]]
    check(hf, ours, images, raw, OPTIONS[option])


def test_wire_layout_is_vllms_field_config(ours):
    got = ours.process([np.asarray(IMAGES["odd"])], ours.resolve({}), raw_pixels=False)
    assert got.flat_keys == {"pixel_values": SIZES_KEY}
    assert got.batched_keys == (SIZES_KEY,)
    assert got.keep_on_cpu_keys == (SIZES_KEY, TOKEN_ID_KEY)  # shared: in neither of the above
    assert got.tensors[TOKEN_ID_KEY].item() == got.embed_token_id == ours.anchor_token_id


def vllm_prompt(vllm_processor, count: int) -> list[int]:
    tokenizer = vllm_processor.info.get_tokenizer()
    text = (
        "<|im_start|>user\n" + "<IMG_CONTEXT>\n" * count + "hi<|im_end|>\n<|im_start|>assistant\n"
    )
    return tokenizer.encode(text, add_special_tokens=False)


@pytest.mark.parametrize(
    "options", [{}, {"max_patches": 2}, {"crop_to_patches": False}, {"min_patches": 3}]
)
def test_equals_what_vllm_feeds_the_model(vllm_processor, ours, options):
    """vLLM's own processor on the same prompt and images: expanded ids, placeholder ranges
    and their embedding masks, every tensor and its field layout."""
    from vllm.multimodal.inputs import (
        MultiModalBatchedField,
        MultiModalFlatField,
        MultiModalSharedField,
    )

    images = [IMAGES["tall"], IMAGES["large"], IMAGES["tiny"]]
    prompt = vllm_prompt(vllm_processor, len(images))
    items = vllm_processor.info.parse_mm_data({"image": images})
    want = vllm_processor(prompt, items, hf_processor_mm_kwargs=options)

    got = ours.process([np.asarray(i) for i in images], ours.resolve(options), raw_pixels=False)
    placeholders = Placeholders("image", ours.anchor_token_id, got.replacements)
    ids, (ranges,) = expand(prompt, [placeholders])
    assert ids == list(want["prompt_token_ids"])
    want_ranges = want["mm_placeholders"]["image"]
    assert ranges == [(p.offset, p.length) for p in want_ranges]
    for (offset, length), p in zip(ranges, want_ranges):
        mask = np.asarray(ids[offset : offset + length]) == got.embed_token_id
        assert np.array_equal(mask, p.is_embed.numpy())

    start = 0
    for item, tiles in zip(want["mm_kwargs"]["image"], got.tensors[SIZES_KEY]):
        assert isinstance(item["pixel_values"].field, MultiModalFlatField)
        assert isinstance(item[SIZES_KEY].field, MultiModalBatchedField)
        assert isinstance(item[TOKEN_ID_KEY].field, MultiModalSharedField)
        assert item[SIZES_KEY].data.item() == tiles
        assert item[TOKEN_ID_KEY].data.item() == got.tensors[TOKEN_ID_KEY].item()
        theirs = item["pixel_values"].data.numpy()
        mine = got.tensors["pixel_values"][start : start + tiles]
        assert mine.shape == theirs.shape
        assert np.abs(mine.astype(np.float64) - theirs).max() <= 1e-5
        start += tiles


def sizes_to_count() -> list[tuple[int, int]]:
    rng = np.random.default_rng(0)
    sizes = [
        (h, w)
        for h in (1, 2, 7, 223, 224, 447, 448, 449, 896, 1344)
        for w in (1, 3, 224, 448, 672, 900, 1344, 4000)
    ]
    sizes += [tuple(int(x) for x in rng.integers(1, 3000, 2)) for _ in range(200)]
    # Aspect ratios at a grid's, where ties decide between grids of different tile counts.
    sizes += [(k, 2 * k) for k in range(1, 700, 9)] + [(3 * k, k) for k in range(1, 500, 13)]
    return sizes


@pytest.mark.parametrize("options", [{}, {"max_patches": 6}, {"min_patches": 2, "max_patches": 9}])
def test_token_counts_are_vllms(vllm_processor, hf, ours, options):
    """vLLM's InternS1ProcessingInfo.get_num_image_tokens (which it computes from the HF image
    processor, given the processor's crop_to_patches default) and transformers' counts."""
    info = vllm_processor.info
    hf_processor = info.get_hf_processor()
    tiling = ours.resolve(options)
    sizes = sizes_to_count()
    counts = [ours.num_image_tokens(h, w, tiling) for h, w in sizes]
    kwargs = {"crop_to_patches": True, **options}
    vllm_counts = [
        info.get_num_image_tokens(
            image_width=w, image_height=h, processor=hf_processor, mm_kwargs=kwargs
        )
        + 2  # vLLM counts the embeddings; the replacement adds <img> and </img>
        for h, w in sizes
    ]
    assert counts == vllm_counts
    # InternVLProcessor._get_num_multimodal_tokens, without its update of the class's shared
    # default kwargs (which would change every later call in this process).
    per_tile = hf_processor.image_seq_length
    hf_counts = [
        2 + per_tile * hf.image_processor.get_number_of_image_patches(h, w, kwargs)
        for h, w in sizes
    ]
    assert counts == hf_counts


def test_defaults_come_from_the_configs(ours):
    # Tiling on although the released preprocessor config says crop_to_patches: false.
    assert ours.resolve({}) == Tiling(crop_to_patches=True, min_patches=1, max_patches=12)
    assert ours.settings.tile == 448 and ours.settings.tokens_per_tile == IMAGE_SEQ_LENGTH
    assert ours.placeholder_text == "<IMG_CONTEXT>"
    assert ours.resolve({"max_patches": 4, "crop_to_patches": None}) == Tiling(True, 1, 4)


def test_placeholder_text_is_vllms():
    from vllm.model_executor.models.interns1 import InternS1ForConditionalGeneration

    assert InternS1ForConditionalGeneration.get_placeholder_str("image", 1) == (
        InternVLProcessor.placeholder_text
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_dynamic_patch": 6}, r"unsupported mm_processor_kwargs \['max_dynamic_patch'\]"),
        ({"dynamic_image_size": False}, "accepted: crop_to_patches, min_patches, max_patches"),
        ({"size": {"height": 224, "width": 224}}, r"\['size'\]"),
        ({"max_patches": 0}, "max_patches must be a positive integer"),
        ({"min_patches": "2"}, "min_patches must be a positive integer"),
        ({"crop_to_patches": 1}, "crop_to_patches must be true or false"),
        ({"max_patches": MOST_PATCHES + 1}, f"max_patches must be at most {MOST_PATCHES}"),
    ],
)
def test_options_are_refused_with_the_key_named(ours, options, message):
    with pytest.raises(OptionError, match=message):
        ours.resolve(options)


def test_families_are_told_apart(ours):
    from types import SimpleNamespace

    from multimodal.registry import FAMILIES

    assert type(ours) is InternVLProcessor
    for config, pre, claimed in [
        ({"model_type": "internvl"}, {"image_processor_type": "GotOcr2ImageProcessorFast"}, True),
        ({"model_type": "internvl"}, {"image_processor_type": "GotOcr2ImageProcessor"}, True),
        ({"model_type": "internvl"}, {}, True),
        # The remote-code format and others with GOT-OCR's processor are not this family.
        ({"model_type": "internvl_chat"}, {}, False),
        ({"model_type": "got_ocr2"}, {"image_processor_type": "GotOcr2ImageProcessor"}, False),
        ({"model_type": "internvl"}, {"image_processor_type": "SomethingElse"}, False),
    ]:
        files = SimpleNamespace(config=config, preprocessor=pre, video_preprocessor={}, vocab={})
        assert InternVLProcessor.matches(files) == claimed
        others = [f.__name__ for f in FAMILIES if f is not InternVLProcessor and f.matches(files)]
        assert others == [], f"{others} claim {config}"


@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float"])
def test_without_the_native_kernels_the_same_tensors(ours, monkeypatch, raw):
    from multimodal import native

    images = [np.asarray(IMAGES[name]) for name in ("large", "square", "very thin")]
    want = ours.process(images, ours.resolve({}), raw_pixels=raw).tensors["pixel_values"]
    monkeypatch.setattr(native, "AVAILABLE", False)
    got = ours.process(images, ours.resolve({}), raw_pixels=raw).tensors["pixel_values"]
    assert np.array_equal(got, want)
