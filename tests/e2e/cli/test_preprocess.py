"""`mmgate preprocess` as a user runs it: a real subprocess on a local image file."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
from PIL import Image

from tests.engines import ROOT


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", "preprocess", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_json_report_matches_transformers(vision_model, tmp_path):
    path = tmp_path / "photo.jpg"
    rng = np.random.default_rng(3)
    Image.fromarray(rng.integers(0, 255, (240, 320, 3), dtype=np.uint8)).save(path)
    out = tmp_path / "tensors.npz"
    result = run_cli(
        "--model",
        str(vision_model),
        "--image",
        str(path),
        "--image",
        str(path),
        "--json",
        "--compare-hf",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["processor"] == "qwen_vl"
    assert report["tensors"]["pixel_values"]["dtype"] == "uint8"
    assert report["flat_keys"] == {"pixel_values": "patches_per_image"}
    assert len(report["placeholders"]) == len(report["hashes"]) == 2
    assert report["hashes"][0] == report["hashes"][1]  # same bytes, same settings
    assert report["compare_hf"]["prompt_ids_equal"] is True
    assert report["compare_hf"]["pixel_values"]["max_abs_diff"] == 0.0
    saved = np.load(out)
    assert saved["prompt_ids"].tolist() == report["prompt_ids"]


def test_float_pixels_and_options(vision_model, tmp_path):
    path = tmp_path / "photo.png"
    Image.new("RGB", (500, 400), (10, 200, 30)).save(path)
    result = run_cli(
        "--model",
        str(vision_model),
        "--image",
        str(path),
        "--json",
        "--compare-hf",
        "--pixels",
        "float32",
        "--mm-processor-kwargs",
        '{"max_pixels": 12544}',
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["tensors"]["pixel_values"]["dtype"] == "float32"
    assert report["compare_hf"]["pixel_values"]["max_abs_diff"] <= 1e-5
    assert report["tensors"]["image_grid_thw"]["max"] <= 8  # 12544 px = 16 patches of 28


def test_errors_are_one_clear_line(vision_model, tmp_path):
    result = run_cli("--model", str(vision_model), "--image", str(tmp_path / "missing.png"))
    assert result.returncode == 1
    assert "image 0" in result.stderr and "Traceback" not in result.stderr
