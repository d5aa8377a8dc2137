"""LLaVA-OneVision videos in the gateway (multimodal.processors.llava_onevision) against vLLM's
own video loader and processor run offline on the tiny model
(tests/support/llava_onevision_models.py: LlavaOnevisionVideoProcessor, 384x384 frames).

vLLM's default `opencv` loader keeps at most 32 frames, evenly spaced; each frame is resized
and normalized on its own, and a video costs 14x14 pooled tokens a frame plus a newline.
Clips of odd sizes, rates and lengths (mp4 and avi, one of 45 frames), alone and two of one
length in a chat: every item's tensor, the prompt ids and the ranges are compared exactly
(float32; vLLM does not normalize OneVision's pixels on device). Videos of different lengths
in one request are refused (they kill vLLM's engine core).
"""

from __future__ import annotations

import numpy as np
import pytest

from multimodal.errors import MmgateError
from multimodal.policy import MediaPolicy
from multimodal.processors.base import VideoSampling
from multimodal.video import load_video
from tests.support import load_processor
from tests.support.gateway_video import gateway_video_inputs
from tests.support.llava_onevision_models import build_model
from tests.support.video_e2e import data_uri, make_clip
from tests.support.vllm_video import vllm_video_inputs

CLIPS = {  # name: (file, frames, (width, height), fps, fourcc)
    "odd size": ("a.mp4", 10, (90, 66), 7.5, "mp4v"),
    "3 frames": ("b.avi", 3, (70, 94), 4, "MJPG"),
    "45 frames": ("c.avi", 45, (122, 58), 24, "MJPG"),
}
MIME = {"mp4": "video/mp4", "avi": "video/x-msvideo"}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("onevision") / "model", weights=False)


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> list[str]:
    tmp = tmp_path_factory.mktemp("clips")
    return [
        data_uri(make_clip(tmp, file, frames, size, fps, fourcc, seed), MIME[file[-3:]])
        for seed, (file, frames, size, fps, fourcc) in enumerate(CLIPS.values())
    ]


@pytest.mark.sampled  # each case asks vLLM's processor: a sample in the fast loop
@pytest.mark.parametrize(
    ("case", "frames"),
    [([0], 10), ([1], 3), ([2], 32), ([0, 0], 10)],
    ids=["odd size", "3 frames", "45 frames", "two of one length"],
)
def test_tensors_prompt_and_ranges_equal_vllm_s(model, clips, case, frames):
    videos = [clips[k] for k in case]
    want = vllm_video_inputs(model, videos, dtype="float32")
    ours = gateway_video_inputs(model, videos, raw_pixels=False)
    (part,) = ours.parts
    pixels = part.processed.tensors["pixel_values"]  # (videos, frames, 3, 384, 384)
    assert part.processed.batched_keys == ("pixel_values",) and not part.processed.flat_keys
    assert len(pixels) == len(want["video"]) == len(case)
    for have, item in zip(pixels, want["video"]):
        expected = item["pixel_values_videos"]
        assert have.dtype == expected.dtype == np.float32
        assert have.shape == expected.shape
        assert np.array_equal(have, expected)
    assert ours.prompt_ids == want["prompt_token_ids"]
    assert part.ranges == want["ranges"]["video"]
    assert pixels.shape[1] == frames
    # a frame is 14x14 pooled tokens, plus one newline a video
    assert [n for _, n in part.ranges] == [196 * frames + 1] * len(case)


def test_videos_of_different_lengths_are_refused(model, clips):
    """vLLM 0.32's engine core dies on them (the model embeds a list of videos 3-D)."""
    with pytest.raises(MmgateError, match=r"same number of frames .* these have \[10, 3\]"):
        gateway_video_inputs(model, clips[:2], raw_pixels=False)


def test_the_loader_keeps_32_frames_evenly_spaced(model, clips):
    proc = load_processor(model, "video")
    settings = proc.resolve({})
    clip = load_video(
        clips[2],
        None,
        MediaPolicy(),
        lambda t, f: proc.pick_frames(t, f, settings, VideoSampling()),
    )
    assert clip.clip.total_frames == 45
    assert clip.clip.indices == np.linspace(0, 44, 32, dtype=int).tolist()
    assert clip.clip.indices[:4] == [0, 1, 2, 4]  # truncated spacing, not rounded


def test_raw_pixels_are_the_resized_frames(model, clips):
    """uint8 for an engine that normalizes on device (vLLM does not, for OneVision)."""
    proc = load_processor(model, "video")
    settings = proc.resolve({})
    pick = lambda t, f: proc.pick_frames(t, f, settings, VideoSampling())  # noqa: E731
    loaded = load_video(clips[0], None, MediaPolicy(), pick).clip
    raw = proc.process([loaded], settings, raw_pixels=True).tensors["pixel_values"]
    normalized = proc.process([loaded], settings, raw_pixels=False).tensors["pixel_values"]
    assert raw.shape == normalized.shape == (1, 10, 3, 384, 384) and raw.dtype == np.uint8
    np.testing.assert_array_equal(normalized, (raw.astype(np.float32) - 127.5) / 127.5)


@pytest.mark.sampled  # each case asks vLLM's processor: a sample in the fast loop
@pytest.mark.parametrize(
    "media_io",
    [{"num_frames": 8}, {"fps": 2}, {"fps": 1, "num_frames": 4}],
    ids=["8 frames", "2 fps", "1 fps and 4 frames"],
)
def test_a_request_s_sampling_equals_vllm_s(model, clips, media_io):
    """media_io_kwargs.video: the default loader keeps at most num_frames, and with fps at
    most floor(seconds * fps) of them."""
    videos = [clips[2]]  # 45 frames at 24 fps: 1.9 s
    want = vllm_video_inputs(model, videos, dtype="float32", media_io_kwargs={"video": media_io})
    ours = gateway_video_inputs(model, videos, raw_pixels=False, media_io=media_io)
    (part,) = ours.parts
    assert ours.prompt_ids == want["prompt_token_ids"]
    (item,) = want["video"]
    assert np.array_equal(part.processed.tensors["pixel_values"][0], item["pixel_values_videos"])
