"""Qwen-VL preprocessing against transformers' processor (what vLLM runs) on the same images:
the tiny Qwen2-VL, and Qwen3.5 dense and MoE dirs with the released preprocessor config
(Qwen3VLProcessor: patch 16, mean/std 0.5, 64 Ki to 16 Mi pixels)."""

from __future__ import annotations

import numpy as np
import pytest

from multimodal.processors.base import OptionError
from multimodal.prompt import Placeholders, expand
from tests.support import load_processor
from tests.support.qwen35_models import build_model
from tests.support.synthetic_images import IMAGES


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen3_5", "qwen3_5_moe"])
def model_dir(request, vision_model, tmp_path_factory):
    if request.param == "qwen2_vl":
        return vision_model
    out = tmp_path_factory.mktemp(request.param)
    return build_model(out, weights=False, moe=request.param.endswith("moe"), tiny=False)


@pytest.fixture(scope="module")
def hf(model_dir):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def ours(model_dir):
    return load_processor(model_dir)


def reference(hf, images, raw: bool, **kwargs):
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": "hi"}]
    text = hf.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
    )
    extra = {"do_rescale": False, "do_normalize": False} if raw else {}
    out = hf(text=[text], images=images, return_tensors="np", **extra, **kwargs)
    unexpanded = hf.tokenizer(text)["input_ids"]
    return out, unexpanded


@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float"])
@pytest.mark.parametrize("name", IMAGES)
def test_one_image_matches_transformers(hf, ours, name, raw):
    out, unexpanded = reference(hf, [IMAGES[name]], raw)
    got = ours.process([np.asarray(IMAGES[name])], ours.resolve({}), raw_pixels=raw)
    assert np.array_equal(got.tensors["image_grid_thw"], out["image_grid_thw"])
    want = out["pixel_values"]
    assert got.tensors["pixel_values"].shape == want.shape
    assert got.tensors["pixel_values"].dtype == want.dtype
    diff = np.abs(got.tensors["pixel_values"].astype(np.float64) - want.astype(np.float64))
    assert diff.max() <= (0 if raw else 1e-5), f"max abs diff {diff.max()}"
    placeholders = Placeholders("image", ours.anchor_token_id, got.replacements)
    ids, (ranges,) = expand(unexpanded, [placeholders])
    assert ids == [int(i) for i in out["input_ids"][0]]
    assert [ids[o : o + n] == [ours.anchor_token_id] * n for o, n in ranges] == [True]


def test_several_mixed_images_in_one_request(hf, ours):
    images = [IMAGES["tall"], IMAGES["large"], IMAGES["tiny"]]
    out, unexpanded = reference(hf, images, raw=True)
    got = ours.process([np.asarray(i) for i in images], ours.resolve({}), raw_pixels=True)
    assert np.array_equal(got.tensors["pixel_values"], out["pixel_values"])
    assert got.tensors["patches_per_image"].tolist() == out["image_grid_thw"].prod(1).tolist()
    placeholders = Placeholders("image", ours.anchor_token_id, got.replacements)
    ids, (ranges,) = expand(unexpanded, [placeholders])
    assert ids == [int(i) for i in out["input_ids"][0]]
    assert len(ranges) == 3


def test_per_request_pixel_bounds(hf, ours):
    options = {"min_pixels": 28 * 28 * 4, "max_pixels": 28 * 28 * 16}
    out, _ = reference(
        hf,
        [IMAGES["large"]],
        raw=True,
        size={"shortest_edge": options["min_pixels"], "longest_edge": options["max_pixels"]},
    )
    got = ours.process([np.asarray(IMAGES["large"])], ours.resolve(options), raw_pixels=True)
    assert np.array_equal(got.tensors["image_grid_thw"], out["image_grid_thw"])
    assert np.array_equal(got.tensors["pixel_values"], out["pixel_values"])


@pytest.mark.parametrize(
    "options",
    [
        {"max_pixels": -1},
        {"min_pixels": 10**7, "max_pixels": 10**6},
        {"do_resize": False},
        {"min_pixels": "many"},
    ],
)
def test_bad_options_are_refused(ours, options):
    with pytest.raises(OptionError):
        ours.resolve(options)
