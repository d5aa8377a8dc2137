"""Idefics3 preprocessing against transformers' Idefics3Processor (torchvision backend, the
transformers 5 default, which vLLM runs) on a weightless tiny model dir, and the replacements
against vLLM's own Idefics3ProcessingInfo.get_image_repl.

The model dir uses BICUBIC: the released LANCZOS is declined until `multimodal.resize` has it
(test_lanczos_model_is_left_to_the_workers).
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
from multimodal.processors.idefics3 import Idefics3Processor, SmolVLMProcessor
from multimodal.prompt import Placeholders, expand
from multimodal.resize_weights import METHODS
from tests.support import IMAGES_DIR, load_processor
from tests.support.idefics3_models import BICUBIC, IMAGE_SEQ_LEN, LANCZOS, TILE, build_model
from tests.support.synthetic_images import IMAGES

COMMITTED = sorted(IMAGES_DIR.glob("*.[jp][pn]g"))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("idefics3"), weights=False, resample=BICUBIC)


@pytest.fixture(scope="module")
def model(model_dir):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(model_dir), load_processor(model_dir)


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

    info = object.__new__(Idefics3ProcessingInfo)
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
def test_several_images_in_one_request(model, raw):
    images = [IMAGES[n] for n in ("large", "tiny", "tall", "odd", "very thin")]
    got = check(model, images, raw)
    # The long edge goes to 1456 up or down: 1280x960 -> 4x3 tiles + the global one,
    # 10x12 -> 1214x1456 -> 4x4 + 1, 90x400 -> 328x1456 -> 4x1 + 1.
    assert got.tensors["num_patches"].tolist()[:3] == [13, 17, 5]
    image_id = model[1].anchor_token_id
    assert [r.count(image_id) for r in got.replacements[:3]] == [
        IMAGE_SEQ_LEN * n for n in (13, 17, 5)
    ]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"do_image_splitting": False},
        {"do_image_splitting": True},
        {"size": {"longest_edge": 2 * TILE}},
        {"size": {"longest_edge": TILE}},
        {"max_image_size": {"longest_edge": TILE}},
        {"do_image_splitting": False, "size": {"longest_edge": 3 * TILE}},
    ],
    ids=str,
)
@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float"])
def test_options_match_transformers(model, kwargs, raw):
    check(model, [IMAGES[n] for n in ("large", "square", "wide")], raw, kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"size": {"longest_edge": 1000}}, "multiple of the tile side 364"),
        ({"max_image_size": {"longest_edge": 512}}, "model's tile side 364"),
        ({"size": {"shortest_edge": 10}}, "unsupported"),
        ({"do_image_splitting": "yes"}, "true or false"),
        ({"image_seq_len": 64}, "unsupported"),
    ],
)
def test_refused_options(model, kwargs, message):
    with pytest.raises(OptionError, match=message):
        model[1].resolve(kwargs)


def test_settings_hold_what_changes_the_tensors(model):
    ours = model[1]
    one = ours.process(
        [np.asarray(IMAGES["tiny"])], ours.resolve({"do_image_splitting": False}), False
    )
    assert one.tensors["num_patches"].tolist() == [1]
    assert len(one.replacements[0]) == IMAGE_SEQ_LEN + 3  # fake, global tag, run, fake
    assert ours.resolve({}) == ours.resolve({"do_image_splitting": True})
    assert ours.resolve({}) != ours.resolve({"do_image_splitting": False})
    assert ours.resolve({"size": {"longest_edge": 728}}).longest_edge == 728
    assert ours.placeholder_text == "<image>"


def test_lanczos_model_is_left_to_the_workers(model_dir, tmp_path):
    from gateway.render.model_files import ModelFiles
    from multimodal.registry import processors_for

    lanczos = shutil.copytree(model_dir, tmp_path / "lanczos")
    pre = json.loads((lanczos / "preprocessor_config.json").read_text())
    (lanczos / "preprocessor_config.json").write_text(json.dumps({**pre, "resample": LANCZOS}))
    found = processors_for(ModelFiles.load(lanczos)).by_modality
    assert found == {} if "lanczos" not in METHODS else type(found["image"]) is Idefics3Processor


def test_families_are_told_apart():
    from multimodal.registry import FAMILIES

    pre = {"image_processor_type": "Idefics3ImageProcessor", "resample": BICUBIC}
    for model_type, want in [("idefics3", Idefics3Processor), ("smolvlm", SmolVLMProcessor)]:
        files = SimpleNamespace(config={"model_type": model_type}, preprocessor=pre, vocab={})
        assert [f for f in FAMILIES if f.matches(files)] == [want]
    smol = {"image_processor_type": "SmolVLMImageProcessor", "resample": BICUBIC}
    files = SimpleNamespace(config={"model_type": "smolvlm"}, preprocessor=smol, vocab={})
    assert [f for f in FAMILIES if f.matches(files)] == [SmolVLMProcessor]
    for other in ("llava", "idefics2", "gemma3", "qwen2_vl"):
        files = SimpleNamespace(config={"model_type": other}, preprocessor=pre, vocab={})
        assert not Idefics3Processor.matches(files) and not SmolVLMProcessor.matches(files)
