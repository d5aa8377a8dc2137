"""The committed images (tests/support/images), bytes to tensors, against vLLM's own decode
followed by transformers' processor, for every Qwen-VL variant's settings. Regenerate the
images with `python -m tests.support.images.make`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from multimodal.decode import decode_pixels
from multimodal.policy import MediaPolicy
from tests.support import IMAGES_DIR, load_processor

IMAGES = sorted(IMAGES_DIR.glob("*.[jp][pn]g"))
CLIP = {
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
}
QWEN3 = {
    "patch_size": 16,
    "min_pixels": 65536,
    "max_pixels": 16777216,
    "image_mean": [0.5] * 3,
    "image_std": [0.5] * 3,
}
VARIANTS = {
    # name: (config model_type, preprocessor settings)
    "qwen2_vl-tiny": ("qwen2_vl", {}),
    "qwen2_5_vl": (
        "qwen2_5_vl",
        {"patch_size": 14, "min_pixels": 3136, "max_pixels": 12845056, **CLIP},
    ),
    "qwen3_vl": ("qwen3_vl", QWEN3),
    "qwen3_5": ("qwen3_5", QWEN3),  # Qwen3.5 ships Qwen3-VL's processor settings
}


def variant_dir(base: Path, dest: Path, model_type: str, settings: dict) -> Path:
    shutil.copytree(base, dest)
    config = json.loads((dest / "config.json").read_text())
    config["model_type"] = model_type
    (dest / "config.json").write_text(json.dumps(config))
    pre = json.loads((dest / "preprocessor_config.json").read_text())
    pre.update(settings)
    if "min_pixels" in settings:
        pre["size"] = {
            "shortest_edge": settings["min_pixels"],
            "longest_edge": settings["max_pixels"],
        }
    (dest / "preprocessor_config.json").write_text(json.dumps(pre))
    (dest / "processor_config.json").unlink()  # the flat file is then the only source
    return dest


@pytest.fixture(scope="module", params=VARIANTS)
def variant(request, vision_model, tmp_path_factory):
    from transformers import AutoImageProcessor

    model_type, settings = VARIANTS[request.param]
    path = variant_dir(
        vision_model, tmp_path_factory.mktemp("v") / request.param, model_type, settings
    )
    return load_processor(path), AutoImageProcessor.from_pretrained(path)


@pytest.fixture(scope="module")
def vllm_decode():
    from vllm.multimodal.media import ImageMediaIO

    return lambda data: ImageMediaIO().load_bytes(data).media


@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float"])
@pytest.mark.parametrize("path", IMAGES, ids=[p.stem for p in IMAGES])
def test_committed_image_matches_vllm_then_transformers(variant, vllm_decode, path, raw):
    ours, hf = variant
    data = path.read_bytes()
    theirs_image = vllm_decode(data)
    extra = {"do_rescale": False, "do_normalize": False} if raw else {}
    want = hf(images=[theirs_image], return_tensors="np", **extra)
    # The gateway's decode: libjpeg-turbo straight into an array for the JPEGs.
    pixels = np.asarray(decode_pixels(data, MediaPolicy())[0])
    got = ours.process([pixels], ours.resolve({}), raw_pixels=raw)
    assert np.array_equal(got.tensors["image_grid_thw"], want["image_grid_thw"])
    diff = np.abs(got.tensors["pixel_values"].astype(np.float64) - want["pixel_values"])
    assert got.tensors["pixel_values"].dtype == want["pixel_values"].dtype
    assert diff.max() <= (0 if raw else 1e-5), f"max abs diff {diff.max()}"
    merge = ours.settings.merge_size**2
    assert len(got.replacements[0]) == int(want["image_grid_thw"][0].prod()) // merge
