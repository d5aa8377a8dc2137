"""LLaVA-OneVision preprocessing against transformers' LlavaOnevisionProcessor (torchvision
backend, transformers 5's default and what vLLM runs), with token counts also checked against
vLLM's own LlavaOnevisionProcessingInfo.get_num_image_tokens.

The tiny model dir (configs, tokenizer, processor configs; no weights) is written at test time
with the released checkpoint's processor settings.
"""

from __future__ import annotations

import numpy as np
import pytest

from multimodal.decode import decode_pixels
from multimodal.policy import MediaPolicy
from multimodal.processors.base import OptionError
from multimodal.processors.llava_next import num_image_tokens as next_count
from multimodal.processors.llava_onevision import LlavaOnevisionProcessor, num_image_tokens
from multimodal.processors.options import NoOptions
from multimodal.prompt import Placeholders, expand
from tests.support import IMAGES_DIR, load_processor
from tests.support.llava_onevision_models import PINPOINTS, build_model
from tests.support.synthetic_images import IMAGES

COMMITTED = sorted(IMAGES_DIR.glob("*.[jp][pn]g"))


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from transformers import AutoProcessor

    path = build_model(tmp_path_factory.mktemp("llava_onevision"), weights=False)
    return path, AutoProcessor.from_pretrained(path), load_processor(path)


def chat_prompt(hf, count: int) -> str:
    content = [{"type": "image"} for _ in range(count)] + [{"type": "text", "text": "hi"}]
    return hf.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
    )


def check(hf, ours, images, raw: bool):
    """Our tensors and expanded prompt against transformers' processor. The images go in as
    one flat list, as vLLM passes them: transformers then tiles every image, as vLLM counts."""
    text = chat_prompt(hf, len(images))
    extra = {"do_rescale": False, "do_normalize": False} if raw else {}
    want = hf(text=[text], images=list(images), return_tensors="np", **extra)
    got = ours.process([np.asarray(i) for i in images], ours.resolve({}), raw_pixels=raw)
    have, expected = got.tensors["pixel_values"], want["pixel_values"]
    assert have.shape == expected.shape
    # With do_rescale/do_normalize off transformers leaves uint8: what vLLM would send raw.
    assert have.dtype == expected.dtype == (np.uint8 if raw else np.float32)
    diff = np.abs(have.astype(np.float64) - expected.astype(np.float64))
    assert diff.max() <= (0 if raw else 1e-5), f"max abs diff {diff.max()}"
    assert got.tensors["image_sizes"].dtype == want["image_sizes"].dtype
    assert np.array_equal(got.tensors["image_sizes"], want["image_sizes"])
    assert got.batched_keys == ("pixel_values", "image_sizes")
    assert got.keep_on_cpu_keys == ("image_sizes",)
    assert got.embed_token_id is None
    unexpanded = hf.tokenizer(text)["input_ids"]
    placeholders = Placeholders("image", ours.anchor_token_id, got.replacements)
    ids, (ranges,) = expand(unexpanded, [placeholders])
    assert ids == [int(i) for i in want["input_ids"][0]]
    assert all(ids[o : o + n] == [ours.anchor_token_id] * n for o, n in ranges)
    return got


def test_the_model_is_onevisions(model):
    _, hf, ours = model
    assert type(ours) is LlavaOnevisionProcessor
    assert ours.anchor_token_id == hf.tokenizer.convert_tokens_to_ids("<image>")
    assert ours.placeholder_text == "<image>"
    assert ours.tower.base_tokens() == 729  # 27x27 SigLIP patches, "full" selection


@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float"])
@pytest.mark.parametrize("name", IMAGES)
def test_one_image_matches_transformers(model, name, raw):
    _, hf, ours = model
    check(hf, ours, [IMAGES[name]], raw)


@pytest.fixture(scope="module")
def vllm_decode():
    from vllm.multimodal.media import ImageMediaIO

    return lambda data: ImageMediaIO().load_bytes(data).media


@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float"])
@pytest.mark.parametrize("path", COMMITTED, ids=[p.stem for p in COMMITTED])
def test_committed_image_matches_vllm_then_transformers(model, vllm_decode, path, raw):
    """Bytes to tensors: vLLM's decode then transformers' processor, against our decode (the
    gateway's) then ours."""
    _, hf, ours = model
    data = path.read_bytes()
    extra = {"do_rescale": False, "do_normalize": False} if raw else {}
    want = hf.image_processor(images=[vllm_decode(data)], return_tensors="np", **extra)
    pixels = np.asarray(decode_pixels(data, MediaPolicy())[0])
    got = ours.process([pixels], ours.resolve({}), raw_pixels=raw)
    have = got.tensors["pixel_values"]
    assert have.dtype == want["pixel_values"].dtype and have.shape == want["pixel_values"].shape
    diff = np.abs(have.astype(np.float64) - want["pixel_values"])
    assert diff.max() <= (0 if raw else 1e-5), f"max abs diff {diff.max()}"
    assert np.array_equal(got.tensors["image_sizes"], want["image_sizes"])
    (h, w) = pixels.shape[:2]
    counted = hf._get_num_multimodal_tokens(image_sizes=[(h, w)])["num_image_tokens"]
    assert [len(r) for r in got.replacements] == counted


@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float"])
def test_several_mixed_images_in_one_request(model, raw):
    _, hf, ours = model
    images = [IMAGES["tall"], IMAGES["large"], IMAGES["tiny"], IMAGES["odd"]]
    got = check(hf, ours, images, raw)
    # Every image is tiled (3, 13, 2, 2 tiles), the shorter ones zero-padded to 13.
    assert got.tensors["pixel_values"].shape[:2] == (4, 13)
    assert got.tensors["image_sizes"].tolist() == [[400, 90], [960, 1280], [12, 10], [177, 333]]


def test_several_images_stay_tiled_unlike_transformers_nested_call(model):
    """transformers' processor, given a sample's images as a nested list, turns tiling off
    (one padded square tile, 729 + 1 tokens each); vLLM passes a flat list and counts tiled
    images, and so do we."""
    _, hf, ours = model
    images = [IMAGES["tall"], IMAGES["large"]]
    nested = hf(text=[chat_prompt(hf, 2)], images=[images], return_tensors="np")
    assert nested["pixel_values"].shape[1] == 1
    got = ours.process([np.asarray(i) for i in images], ours.resolve({}), raw_pixels=True)
    assert got.tensors["pixel_values"].shape[1] == 13
    assert [len(r) for r in got.replacements] == [
        ours.num_image_tokens(400, 90),
        ours.num_image_tokens(960, 1280),
    ]
    assert all(len(r) > 730 for r in got.replacements)


def sizes_to_count() -> list[tuple[int, int]]:
    rng = np.random.default_rng(0)
    sizes = [
        (h, w)
        for h in (1, 2, 7, 14, 177, 383, 384, 385, 767, 768, 1152, 2304, 3000)
        for w in (1, 3, 8, 333, 384, 500, 768, 1000, 1153, 2304, 5000)
    ]
    sizes += [tuple(int(x) for x in rng.integers(1, 4000, 2)) for _ in range(300)]
    # Aspect ratios right at a pinpoint's, where the branch and rounding are decided.
    sizes += [(k, k * 2) for k in range(1, 1200, 13)] + [(k * 3, k) for k in range(1, 800, 11)]
    return sizes


def test_token_count_is_vllms_and_transformers(model):
    """Our count equals vLLM's get_num_image_tokens and transformers' (single image) count on
    many odd sizes, the anyres_max_9 cap included."""
    from transformers import AutoConfig

    path, hf, ours = model
    sizes = sizes_to_count()
    counts = [ours.num_image_tokens(h, w) for h, w in sizes]
    assert counts == [num_image_tokens(h, w, ours.tower, PINPOINTS) for h, w in sizes]
    assert counts == hf._get_num_multimodal_tokens(image_sizes=sizes)["num_image_tokens"]
    # The cap is exercised: large images count fewer than LLaVA-NeXT's uncapped math gives.
    uncapped = [next_count(h, w, ours.tower, PINPOINTS) for h, w in sizes]
    assert sum(c < u for c, u in zip(counts, uncapped)) > 50
    assert max(counts) < 729 + 1.1**2 * 9 * 729 + 27 * 1.1 * 3

    onevision = pytest.importorskip("vllm.model_executor.models.llava_onevision")
    # vLLM's ProcessingInfo only needs the HF config; skip the rest of its context.
    info = object.__new__(onevision.LlavaOnevisionProcessingInfo)
    config = AutoConfig.from_pretrained(path)
    info.get_hf_config = lambda: config
    assert counts == [info.get_num_image_tokens(image_width=w, image_height=h) for h, w in sizes]


def test_families_are_told_apart():
    """Only OneVision claims OneVision's model, and OneVision claims none of LLaVA's."""
    from types import SimpleNamespace

    from multimodal.processors.llava import LlavaProcessor
    from multimodal.processors.llava_next import LlavaNextProcessor
    from multimodal.registry import FAMILIES

    cases = [
        ("llava_onevision", "LlavaOnevisionImageProcessorFast", LlavaOnevisionProcessor),
        ("llava_onevision", None, LlavaOnevisionProcessor),
        ("llava_next", "LlavaNextImageProcessor", LlavaNextProcessor),
        ("llava", "CLIPImageProcessor", LlavaProcessor),
        # A OneVision model_type with another image processor is not ours to reproduce.
        ("llava_onevision", "SiglipImageProcessor", None),
    ]
    for model_type, kind, want in cases:
        pre = {} if kind is None else {"image_processor_type": kind}
        files = SimpleNamespace(
            config={"model_type": model_type}, preprocessor=pre, video_preprocessor={}, vocab={}
        )
        images = [f for f in FAMILIES if f.modality == "image" and f.matches(files)]
        assert images == ([want] if want else [])


@pytest.mark.parametrize(
    "options",
    [{"do_resize": False}, {"image_grid_pinpoints": [[384, 384]]}, {"vision_aspect_ratio": "x"}],
)
def test_options_are_refused(model, options):
    """vLLM counts tokens from the model config alone: a per-request processor setting would
    make the pixels disagree with the placeholder count, so none is accepted."""
    _, _, ours = model
    assert ours.resolve({}) == NoOptions()
    with pytest.raises(OptionError, match="accepted: none"):
        ours.resolve(options)
