"""LLaVA-OneVision videos in the gateway (multimodal.processors.llava_onevision) against vLLM's
own video loader and processor run offline on the tiny model
(tests/support/llava_onevision_models.py: LlavaOnevisionVideoProcessor, 384x384 frames).

vLLM's default `opencv` loader keeps at most 32 frames, evenly spaced; each frame is resized
and normalized on its own, and a video costs 14x14 pooled tokens a frame plus a newline. One
chat holds three clips of odd sizes, rates and lengths (mp4 and avi, one of 45 frames): every
item's tensor, the prompt ids and the ranges are compared exactly (float32; vLLM does not
normalize OneVision's pixels on device).
"""

from __future__ import annotations

import numpy as np
import pytest

from multimodal.policy import MediaPolicy
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


@pytest.fixture(scope="module")
def reference(model, clips) -> dict:
    return vllm_video_inputs(model, clips, dtype="float32")


@pytest.fixture(scope="module")
def ours(model, clips):
    return gateway_video_inputs(model, clips, raw_pixels=False)


def test_every_video_s_frames_equal_vllm_s(reference, ours):
    (part,) = ours.parts
    tensors = part.processed.tensors
    # Clips of different lengths: one zero-padded batch, each video's extent beside it.
    extents = tensors["video_extents"].tolist()
    assert part.processed.flat_keys == {"pixel_values": "video_extents"}
    assert [e[0] for e in extents] == [10, 3, 32]
    assert len(reference["video"]) == len(CLIPS)
    for name, padded, extent, item in zip(
        CLIPS, tensors["pixel_values"], extents, reference["video"]
    ):
        have = padded[: extent[0]]
        assert list(have.shape) == extent, name
        assert not padded[extent[0] :].any(), name
        want = item["pixel_values_videos"]
        assert have.dtype == want.dtype == np.float32, name
        assert have.shape == want.shape, name
        assert np.array_equal(have, want), name


def test_prompt_ids_and_ranges_equal_vllm_s(reference, ours):
    assert ours.prompt_ids == reference["prompt_token_ids"]
    assert ours.parts[0].ranges == reference["ranges"]["video"]
    # a frame is 14x14 pooled tokens, plus one newline a video
    assert [n for _, n in ours.parts[0].ranges] == [196 * f + 1 for f in (10, 3, 32)]


def test_the_loader_keeps_32_frames_evenly_spaced(model, clips):
    proc = load_processor(model, "video")
    settings = proc.resolve({})
    clip = load_video(clips[2], None, MediaPolicy(), lambda t, f: proc.pick_frames(t, f, settings))
    assert clip.clip.total_frames == 45
    assert clip.clip.indices == np.linspace(0, 44, 32, dtype=int).tolist()
    assert clip.clip.indices[:4] == [0, 1, 2, 4]  # truncated spacing, not rounded


def test_videos_of_one_length_are_a_plain_batch(model, clips):
    proc = load_processor(model, "video")
    settings = proc.resolve({})
    pick = lambda t, f: proc.pick_frames(t, f, settings)  # noqa: E731
    loaded = load_video(clips[0], None, MediaPolicy(), pick).clip
    processed = proc.process([loaded, loaded], settings, raw_pixels=True)
    assert processed.tensors["pixel_values"].shape == (2, 10, 3, 384, 384)
    assert processed.tensors["pixel_values"].dtype == np.uint8
    assert processed.batched_keys == ("pixel_values",) and not processed.flat_keys
    assert processed.replacements == [[proc.anchor_token_id] * (196 * 10 + 1)] * 2
