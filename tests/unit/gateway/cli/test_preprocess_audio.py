"""`mmgate preprocess --audio` on the tiny Qwen2-Audio, down either path: by default (auto) the
gateway has the model's audio processor and shows its tensors, each clip's placeholder and
tokens; with `--mm-processing worker` the clips go to the worker as `mmgate serve` sends them,
the prompt with one unexpanded placeholder per clip. Each clip's facts as decoded either way."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gateway.cli.preprocess import main
from tests.support.qwen2_audio_models import AUDIO
from tests.unit.gateway.api.test_preprocess_audio import clip, qwen2_audio_model  # noqa: F401


@pytest.fixture
def clips(tmp_path) -> tuple[Path, Path]:
    mono, stereo = tmp_path / "mono.wav", tmp_path / "stereo.flac"
    mono.write_bytes(clip(1.0, 16000, 1))
    stereo.write_bytes(clip(0.5, 44100, 2, "FLAC"))
    return mono, stereo


def clip_facts(mono: Path, stereo: Path) -> list[dict]:
    return [
        {
            "format": "wav",
            "sample_rate": 16000,
            "channels": 1,
            "seconds": 1.0,
            "bytes": mono.stat().st_size,
        },
        {
            "format": "flac",
            "sample_rate": 44100,
            "channels": 2,
            "seconds": 0.5,
            "bytes": stereo.stat().st_size,
        },
    ]


def test_the_gateway_s_tensors_placeholders_and_tokens_as_json(
    qwen2_audio_model,  # noqa: F811
    clips,
    capsys,
    tmp_path,
):
    from transformers import AutoTokenizer

    mono, stereo = clips
    out = tmp_path / "tensors.npz"
    args = ["--model", str(qwen2_audio_model), "--audio", str(mono), "--audio", str(stereo)]
    assert main([*args, "--json", "--out", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["processed_by"] == "gateway"
    assert report["audio"] == clip_facts(mono, stereo)
    (part,) = report["parts"]
    assert (part["modality"], part["processor"]) == ("audio", "qwen2_audio")
    shapes = {name: (t["shape"], t["dtype"]) for name, t in part["tensors"].items()}
    assert shapes == {
        "input_features": ([2, 128, 3000], "float32"),
        "feature_attention_mask": ([2, 3000], "int32"),
    }
    # ((L-1)//2+1-2)//2+1 tokens per clip, L its 10 ms mel frames at 16 kHz: 100 and 50
    tokens = [((n - 1) // 2 + 1 - 2) // 2 + 1 for n in (100, 50)]
    assert [p["length"] for p in part["placeholders"]] == tokens == [25, 12]
    audio_id = AutoTokenizer.from_pretrained(qwen2_audio_model).convert_tokens_to_ids(AUDIO)
    ids = report["prompt_ids"]
    for p in part["placeholders"]:
        assert set(ids[p["offset"] : p["offset"] + p["length"]]) == {audio_id}
    assert ids.count(audio_id) == sum(tokens)
    saved = np.load(out)
    assert saved["prompt_ids"].tolist() == ids
    assert saved["ranges"].tolist() == [[p["offset"], p["length"]] for p in part["placeholders"]]
    assert saved["feature_attention_mask"].sum(axis=1).tolist() == [100, 50]


def test_the_gateway_s_human_report_shows_each_clip_under_its_placeholder(
    qwen2_audio_model,  # noqa: F811
    clips,
    capsys,
):
    mono, _ = clips
    assert main(["--model", str(qwen2_audio_model), "--audio", str(mono)]) == 0
    shown = capsys.readouterr().out
    assert "audio:         processor qwen2_audio" in shown
    assert "  tensor       input_features     float32  [1, 128, 3000]" in shown
    assert "  audio 0      placeholder offset " in shown and " length 25  hash " in shown
    assert f"    decoded    wav  16000 Hz  1 channel(s)  1 s  {mono.stat().st_size} bytes" in shown


def test_the_worker_s_path_shows_the_clips_facts_as_json(
    qwen2_audio_model,  # noqa: F811
    clips,
    capsys,
    tmp_path,
):
    from transformers import AutoTokenizer

    mono, stereo = clips
    out = tmp_path / "ids.npz"
    args = ["--model", str(qwen2_audio_model), "--audio", str(mono), "--audio", str(stereo)]
    assert main([*args, "--mm-processing", "worker", "--json", "--out", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["processed_by"] == "worker"
    assert report["why"] == "--mm-processing worker"
    assert report["parts"] == []
    assert report["audio"] == clip_facts(mono, stereo)
    # one placeholder per clip, for the worker to expand, in the model's template's words
    audio_id = AutoTokenizer.from_pretrained(qwen2_audio_model).convert_tokens_to_ids(AUDIO)
    assert report["prompt_ids"].count(audio_id) == 2
    assert np.load(out)["prompt_ids"].tolist() == report["prompt_ids"]


def test_the_worker_s_human_report_names_each_clip(qwen2_audio_model, clips, capsys):  # noqa: F811
    mono, _ = clips
    args = ["--model", str(qwen2_audio_model), "--audio", str(mono), "--mm-processing", "worker"]
    assert main(args) == 0
    shown = capsys.readouterr().out
    assert "preprocessed by the engine worker (--mm-processing worker)" in shown
    assert f"  audio 0      wav  16000 Hz  1 channel(s)  1 s  {mono.stat().st_size} bytes" in shown


@pytest.mark.parametrize("mode", ["auto", "worker"])
def test_bad_audio_is_one_clear_line(qwen2_audio_model, tmp_path, capsys, mode):  # noqa: F811
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"not audio" * 30)
    args = ["--model", str(qwen2_audio_model), "--audio", str(bad), "--mm-processing", mode]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err.startswith("mmgate preprocess: ") and "audio 0: not a supported audio format" in err


def test_some_media_is_required(qwen2_audio_model, capsys):  # noqa: F811
    with pytest.raises(SystemExit):
        main(["--model", str(qwen2_audio_model)])
    assert "give at least one --image, --video or --audio" in capsys.readouterr().err
