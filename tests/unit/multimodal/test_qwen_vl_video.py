"""Qwen2-VL and Qwen2.5-VL videos made by the gateway equal vLLM's own: the frames its Qwen2
loader picks, every tensor (uint8 patches, grids, Qwen2.5's float32 second_per_grid_ts) and
the expanded prompt ids, on tiny models, for clips of odd sizes, rates, lengths and
containers; the normalized float patches equal transformers' video processor's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.support.video_e2e import data_uri, jpeg_frames, make_clip

# name -> (frames, (width, height), fps, fourcc, container MIME)
CLIPS = {
    "mp4-5fps": (10, (90, 66), 5, "mp4v", "video/mp4"),
    "avi-odd-count": (17, (70, 94), 2.4, "MJPG", "video/x-msvideo"),  # 15 frames picked
    "mp4-7.5fps": (40, (322, 240), 7.5, "mp4v", "video/mp4"),
    "three-frames": (3, (64, 48), 3, "mp4v", "video/mp4"),  # 2 picked, never the last
    "webm": (12, (100, 60), 6, "VP80", "video/webm"),
}
SUFFIX = {"video/mp4": "mp4", "video/x-msvideo": "avi", "video/webm": "webm"}


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("clips")
    out = {}
    for seed, (name, (frames, size, fps, fourcc, mime)) in enumerate(CLIPS.items()):
        clip = make_clip(tmp, f"{name}.{SUFFIX[mime]}", frames, size, fps, fourcc, seed)
        out[name] = data_uri(clip, mime)
    out["frame-list"] = jpeg_frames(5, (64, 48), 9)
    return out


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen2_5_vl"])
def model(request, vision_model, tmp_path_factory) -> Path:
    if request.param == "qwen2_vl":
        return vision_model
    from tests.support.qwen25_vl_models import build_model

    return build_model(tmp_path_factory.mktemp("qwen25vl") / "model")


def ours(model: Path, uris: list[str], raw: bool = True):
    from gateway.render.model_files import ModelFiles
    from gateway.render.renderer import ChatRenderer
    from multimodal.media import MediaPolicy
    from multimodal.pipeline import PixelEncoding, decode_items, prepare
    from multimodal.registry import processors_for

    files = ModelFiles.load(model)
    processors = processors_for(files)
    video = processors.get("video")
    parts = [{"type": "video_url", "video_url": {"url": u}} for u in uris]
    messages = [{"role": "user", "content": [*parts, {"type": "text", "text": "Describe."}]}]
    rendered = ChatRenderer(files, processors.placeholders).render(messages)
    items = decode_items(video, uris, [None] * len(uris), video.defaults, MediaPolicy())
    encoding = PixelEncoding(raw=raw)
    return prepare([(video, items)], rendered.token_ids, {}, encoding), items


@pytest.mark.sampled  # each case asks vLLM's processor: a sample in the fast loop
@pytest.mark.parametrize("name", [*CLIPS, "frame-list"])
def test_one_clip_equals_vllm(name, model, clips):
    from tests.support.vllm_video import vllm_video_inputs

    want = vllm_video_inputs(model, [clips[name]])
    prepared, _ = ours(model, [clips[name]])
    assert prepared.prompt_ids == want["prompt_token_ids"]
    (part,) = prepared.parts
    (theirs,) = want["video"]
    tensors = part.processed.tensors
    assert tensors["pixel_values"].dtype == theirs["pixel_values_videos"].dtype
    assert np.array_equal(tensors["pixel_values"], theirs["pixel_values_videos"])
    assert np.array_equal(tensors["video_grid_thw"][0], theirs["video_grid_thw"])
    if "second_per_grid_ts" in theirs:
        ts = tensors["second_per_grid_ts"]
        assert ts.dtype == np.float32  # cast to the model's dtype by the engine, as by vLLM
        assert in_dtype(ts, want["dtype"])[0] == theirs["second_per_grid_ts"]
    else:
        assert "second_per_grid_ts" not in tensors


def in_dtype(values: np.ndarray, dtype: str) -> np.ndarray:
    import torch

    return torch.from_numpy(values).to(getattr(torch, dtype)).float().numpy()


@pytest.mark.sampled  # each case asks vLLM's processor: a sample in the fast loop
def test_two_clips_in_one_prompt_equal_vllm(model, clips):
    from tests.support.vllm_video import vllm_video_inputs

    uris = [clips["avi-odd-count"], clips["mp4-5fps"]]
    want = vllm_video_inputs(model, uris)
    prepared, _ = ours(model, uris)
    assert prepared.prompt_ids == want["prompt_token_ids"]
    pixels = np.concatenate([item["pixel_values_videos"] for item in want["video"]])
    assert np.array_equal(prepared.parts[0].processed.tensors["pixel_values"], pixels)


@pytest.mark.sampled  # each case asks vLLM's processor: a sample in the fast loop
def test_normalized_patches_equal_transformers(model, clips):
    """For engines that take floats: transformers' own video processor on the same frames."""
    import torch
    from transformers import AutoVideoProcessor

    prepared, items = ours(model, [clips["mp4-7.5fps"]], raw=False)
    frames = torch.from_numpy(items[0].clip.frames).permute(0, 3, 1, 2)
    reference = AutoVideoProcessor.from_pretrained(model)(
        videos=[frames], do_sample_frames=False, return_tensors="pt"
    )
    got = prepared.parts[0].processed.tensors["pixel_values"]
    want = reference["pixel_values_videos"].numpy()
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-6


@pytest.mark.sampled  # each case asks vLLM's processor: a sample in the fast loop
@pytest.mark.parametrize(
    ("name", "media_io"),
    [
        ("mp4-7.5fps", {"fps": 1}),
        ("mp4-7.5fps", {"fps": 4.5, "num_frames": 3}),  # Qwen's loader ignores num_frames
        ("frame-list", {"fps": 2, "num_frames": 3}),  # the first 3 frames, at 2 fps
    ],
)
def test_a_request_s_video_sampling_equals_vllm_s(name, media_io, model, clips):
    """media_io_kwargs.video as vLLM's loader takes it (here at the engine level, which a
    request's merge over an unset default equals)."""
    from tests.support.gateway_video import gateway_video_inputs
    from tests.support.vllm_video import vllm_video_inputs

    want = vllm_video_inputs(model, [clips[name]], media_io_kwargs={"video": media_io})
    default = gateway_video_inputs(model, [clips[name]], True)
    prepared = gateway_video_inputs(model, [clips[name]], True, media_io=media_io)
    assert prepared.prompt_ids == want["prompt_token_ids"] != default.prompt_ids
    tensors, (theirs,) = prepared.parts[0].processed.tensors, want["video"]
    assert np.array_equal(tensors["pixel_values"], theirs["pixel_values_videos"])
    if "second_per_grid_ts" in theirs:
        assert (
            in_dtype(tensors["second_per_grid_ts"], want["dtype"])[0]
            == (theirs["second_per_grid_ts"])
        )
    assert prepared.parts[0].hashes != default.parts[0].hashes  # other frames, other key
