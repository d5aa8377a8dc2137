"""`mmgate preprocess --audio` on the tiny Qwen2-Audio: the gateway has no audio processor for it,
so its clips go to the worker as `mmgate serve` sends them; the command shows each clip's facts
as decoded and the prompt with one unexpanded placeholder per clip."""

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


def test_audio_clips_are_shown_with_their_facts_as_json(qwen2_audio_model, clips, capsys, tmp_path):  # noqa: F811
    from transformers import AutoTokenizer

    mono, stereo = clips
    out = tmp_path / "ids.npz"
    args = ["--model", str(qwen2_audio_model), "--audio", str(mono), "--audio", str(stereo)]
    assert main([*args, "--json", "--out", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["processed_by"] == "worker"
    assert report["why"] == "no audio processor in the gateway for this model"
    assert report["audio"] == [
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
    # one placeholder per clip, for the worker to expand, in the model's template's words
    audio_id = AutoTokenizer.from_pretrained(qwen2_audio_model).convert_tokens_to_ids(AUDIO)
    assert report["prompt_ids"].count(audio_id) == 2
    assert np.load(out)["prompt_ids"].tolist() == report["prompt_ids"]


def test_the_human_report_names_each_clip(qwen2_audio_model, clips, capsys):  # noqa: F811
    mono, _ = clips
    assert main(["--model", str(qwen2_audio_model), "--audio", str(mono)]) == 0
    shown = capsys.readouterr().out
    assert "preprocessed by the engine worker (no audio processor in the gateway" in shown
    assert f"  audio 0      wav  16000 Hz  1 channel(s)  1 s  {mono.stat().st_size} bytes" in shown


def test_bad_audio_is_one_clear_line(qwen2_audio_model, tmp_path, capsys):  # noqa: F811
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"not audio" * 30)
    assert main(["--model", str(qwen2_audio_model), "--audio", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("mmgate preprocess: ") and "audio 0: not a supported audio format" in err


def test_some_media_is_required(qwen2_audio_model, capsys):  # noqa: F811
    with pytest.raises(SystemExit):
        main(["--model", str(qwen2_audio_model)])
    assert "give at least one --image, --video or --audio" in capsys.readouterr().err
