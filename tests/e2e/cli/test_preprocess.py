"""`mmgate preprocess` as a user runs it: a real subprocess on local images, checked against
transformers' processor and against vLLM's own /tokenize."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from tests.support.e2e_cases import MM_LIMITS, make_image, png_bytes
from tests.support.engines import MAX_MODEL_LEN, ROOT
from tests.support.vllm_tokenize import VllmTokenization

# ChatML that prints a message's content as one string: vLLM's "string" content format, in
# which each image becomes the model's placeholder text in front of the message's text.
STRING_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


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


@pytest.mark.parametrize("pixels", ["uint8", "float32"])
def test_a_video_shows_its_picked_frames_and_matches_transformers(vision_model, tmp_path, pixels):
    from tests.support.video_e2e import make_clip

    make_clip(tmp_path, "clip.avi", 17, (70, 94), 2.4, "MJPG", 1)
    out = tmp_path / "tensors.npz"
    args = ["--model", str(vision_model), "--video", str(tmp_path / "clip.avi"), "--json"]
    result = run_cli(*args, "--pixels", pixels, "--compare-hf", "--out", str(out))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["modality"], report["processor"]) == ("video", "qwen_vl_video")
    (video,) = report["videos"]
    assert video["frames"] == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 12, 13, 14, 15, 16]
    assert (video["total_frames"], video["fps"], video["size"]) == (17, 2.4, [70, 94])
    compared = report["compare_hf"]
    assert compared["prompt_ids_equal"] is True
    assert compared["video"]["video_grid_thw"]["max_abs_diff"] == 0.0
    assert compared["video"]["pixel_values"]["max_abs_diff"] <= (0 if pixels == "uint8" else 1e-6)
    assert np.load(out)["video_grid_thw"].tolist() == [[8, 6, 4]]
    human = run_cli(*args[:-1])
    assert "frames     [0, 1, 2, 3, 4, 6" in human.stdout, human.stderr


@pytest.mark.parametrize("family", ["glm4v", "qwen3_vl"])
def test_compare_hf_with_the_loader_s_metadata_for_timestamped_videos(family, tmp_path):
    """GLM's and Qwen3's prompts carry each frame's time: transformers needs the loader's
    metadata to write the same prompt."""
    from tests.support.glm4v_models import build_model as glm4v
    from tests.support.qwen3_vl_models import build_model as qwen3_vl
    from tests.support.video_e2e import make_clip

    build = {"glm4v": lambda d: glm4v(d, weights=False), "qwen3_vl": qwen3_vl}[family]
    model = build(tmp_path / "model")
    make_clip(tmp_path, "clip.mp4", 24, (130, 90), 7.5, "mp4v", 2)
    result = run_cli(
        "--model", str(model), "--video", str(tmp_path / "clip.mp4"), "--json", "--compare-hf"
    )
    assert result.returncode == 0, result.stderr
    compared = json.loads(result.stdout)["compare_hf"]
    assert compared["prompt_ids_equal"] is True
    assert compared["video"]["pixel_values"]["max_abs_diff"] == 0.0


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


@pytest.fixture(scope="module")
def string_format_model(vision_model, tmp_path_factory):
    """The tiny vision model with a chat template that takes plain-string content, in every
    place a template is read from."""
    path = tmp_path_factory.mktemp("string-format") / "model"
    shutil.copytree(vision_model, path)
    (path / "chat_template.jinja").write_text(STRING_TEMPLATE)
    config = json.loads((path / "tokenizer_config.json").read_text())
    config["chat_template"] = STRING_TEMPLATE
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("fmt", ["openai", "string"])
def test_prompt_ids_equal_vllm_tokenize(vision_model, string_format_model, fmt):
    """The gateway's one renderer in `mmgate preprocess`: the same expanded prompt ids as vLLM's
    /tokenize for the same chat turn, whichever content format the model's template takes."""
    model = vision_model if fmt == "openai" else string_format_model
    images = [make_image(150, 110, seed=31), make_image(64, 300, seed=32)]
    uris = [f"data:image/png;base64,{base64.b64encode(png_bytes(i)).decode()}" for i in images]
    text = "What differs between these two?"
    result = run_cli("--model", str(model), "--image", uris[0], "--image", uris[1],
                     "--text", text, "--json")  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    content = [*({"type": "image_url", "image_url": {"url": u}} for u in uris)]
    messages = [{"role": "user", "content": [*content, {"type": "text", "text": text}]}]
    vllm = VllmTokenization(model, max_model_len=MAX_MODEL_LEN, limit_mm_per_prompt=MM_LIMITS)
    want = vllm.tokenize({"messages": messages})["tokens"]
    assert report["prompt_ids"] == want
    image_pad = 3005
    lengths = [p["length"] for p in report["placeholders"]]
    assert want.count(image_pad) == sum(lengths) and len(lengths) == 2


def _family_dirs() -> dict:
    from tests.support import (
        gemma3_models,
        gemma4_models,
        glm4v_models,
        idefics3_models,
        internvl_models,
        kimi_k25_models,
        llama4_models,
        llava_onevision_models,
        pixtral_models,
        qwen35_models,
    )

    return {
        "qwen3_5": lambda out: qwen35_models.build_model(out, weights=False, tiny=False),
        "gemma3": lambda out: gemma3_models.build_model(out, weights=False),
        "internvl": lambda out: internvl_models.build_model(out, weights=False),
        "mistral3": lambda out: pixtral_models.build_model(out, weights=False),
        "pixtral": lambda out: pixtral_models.build_model(out, weights=False, kind="pixtral"),
        "llama4": lambda out: llama4_models.build_model(out, weights=False),
        "llava_onevision": lambda out: llava_onevision_models.build_model(out, weights=False),
        "gemma4": lambda out: gemma4_models.build_model(out, weights=False),
        "glm4v": lambda out: glm4v_models.build_model(out, "glm4v", weights=False, tiny=False),
        "glm46v": lambda out: glm4v_models.build_model(out, "glm46v", weights=False, tiny=False),
        "idefics3": lambda out: idefics3_models.build_model(out, weights=False),
        "smolvlm": lambda out: idefics3_models.build_model(
            out, weights=False, variant=idefics3_models.SMOLVLM
        ),
        "kimi_k25": lambda out: kimi_k25_models.build_model(out, weights=False, tiny=False),
    }


@pytest.mark.parametrize("pixels", ["uint8", "float32"])
@pytest.mark.parametrize("family", list(_family_dirs()))
def test_compare_hf_for_every_family_since_wave_2a(family, pixels, tmp_path):
    """`--compare-hf` on two committed images of different sizes: the prompt ids equal
    transformers', every tensor it produces is equal (uint8) or within 1e-5 (float)."""
    from tests.support import IMAGES_DIR

    model = _family_dirs()[family](tmp_path / family)
    images = [str(IMAGES_DIR / "large.jpg"), str(IMAGES_DIR / "tall.png")]
    args = ["--model", str(model), "--image", images[0], "--image", images[1]]
    result = run_cli(*args, "--pixels", pixels, "--json", "--compare-hf")
    assert result.returncode == 0, result.stderr
    compared = json.loads(result.stdout)["compare_hf"]
    assert compared.pop("prompt_ids_equal") is True
    diffs = {k: v["max_abs_diff"] for k, v in compared.items() if isinstance(v, dict)}
    assert "pixel_values" in diffs
    assert max(diffs.values()) <= (0.0 if pixels == "uint8" else 1e-5), diffs
    # the rest are the wire's own sizes tensors, which transformers does not produce
    assert all("not produced by transformers" in v for v in compared.values() if isinstance(v, str))


# Our features against transformers' on the samples torchaudio resampled: the extractor's error
# (float64 here, float32 torch there) plus the resampler's last bits, as in
# tests/unit/multimodal/processors/test_audio_families.py (measured at most 2.1e-5 there; 2.2e-5
# on the WAV here, 4.0e-5 on the resampled FLAC, two pure tones with very quiet mel bins).
AUDIO_ATOL = 5e-5


@pytest.mark.parametrize("family", ["qwen2_audio", "qwen25_omni"])
def test_compare_hf_for_audio(family, tmp_path):
    """`--compare-hf` on a 16 kHz mono WAV and a 44.1 kHz stereo FLAC (resampled, as vLLM's
    chat path resamples, by torchaudio): the prompt ids equal transformers' (its processor
    expands each clip's <|AUDIO|> itself), every audio tensor is there and within AUDIO_ATOL
    (Omni's as vLLM lays out transformers': each clip's real frames, and their counts), the
    integer ones exact."""
    from tests.support import qwen2_audio_models, qwen25_omni_models
    from tests.unit.gateway.api.test_preprocess_audio import clip

    build = {"qwen2_audio": qwen2_audio_models, "qwen25_omni": qwen25_omni_models}[family]
    model = build.build_model(tmp_path / family)
    mono, stereo = tmp_path / "mono.wav", tmp_path / "stereo.flac"
    mono.write_bytes(clip(2.0, 16000, 1))
    stereo.write_bytes(clip(1.3, 44100, 2, "FLAC"))
    args = ["--model", str(model), "--audio", str(mono), "--audio", str(stereo)]
    result = run_cli(*args, "--json", "--compare-hf")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["processed_by"] == "gateway"
    compared = report["compare_hf"]
    assert compared["prompt_ids_equal"] is True
    audio = compared["audio"]
    assert set(audio) == set(report["parts"][0]["tensors"])  # every tensor compared
    assert all(isinstance(v, dict) and v["dtype_equal"] for v in audio.values()), audio
    features = "input_features" if family == "qwen2_audio" else "input_audio_features"
    assert audio[features]["max_abs_diff"] <= AUDIO_ATOL, audio
    assert all(v["max_abs_diff"] == 0.0 for k, v in audio.items() if k != features), audio
