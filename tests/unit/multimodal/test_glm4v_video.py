"""GLM-4.1V videos in the gateway (multimodal.processors.glm4v_video) against vLLM's own video
loader and processor run offline on the tiny `glm4v` model (tests/support/glm4v_models.py:
Glm4vVideoProcessor, its pixels capped at 64 merged patches over all frames).

Clips of odd sizes, rates and lengths, mp4 and avi, each on one of vLLM's paths: the loader's
frames as they come (7.5 fps, which Qwen2-VL's loader would sample otherwise; a long clip
shrunk to the cap), every frame kept so transformers samples again (3 frames at 2 fps; 5,
where the count transformers sees moves the size), and a data:video/jpeg frame list (5
frames, taken whole). Tensors, prompt
ids and placeholder ranges are compared exactly, for uint8 (vLLM's default for GLM:
normalized on device) and float32.
"""

from __future__ import annotations

import numpy as np
import pytest

from multimodal.errors import MediaDecodeError, MmgateError
from multimodal.policy import MediaPolicy
from multimodal.processors.base import VideoSampling
from multimodal.processors.glm4v_video import Glm4vVideoProcessor
from multimodal.registry import processors_for
from multimodal.video import load_video
from tests.support import load_processor
from tests.support.gateway_video import gateway_video_inputs
from tests.support.glm4v_models import build_model
from tests.support.video_e2e import data_uri, jpeg_frames, make_clip
from tests.support.vllm_video import vllm_video_inputs

CLIPS = {  # name: (file, frames, (width, height), fps, fourcc)
    "7.5fps": ("a.mp4", 10, (90, 66), 7.5, "mp4v"),
    "3 frames": ("b.avi", 3, (70, 94), 2, "MJPG"),
    "capped": ("c.mp4", 40, (160, 120), 8, "mp4v"),
    # 5 frames, all kept: transformers sees 6 and the cap shrinks them; 5 count as 4
    # (banker's rounding) and would stay 140x168
    "5 frames, all kept": ("d.avi", 5, (170, 138), 2, "MJPG"),
}
MIME = {"mp4": "video/mp4", "avi": "video/x-msvideo"}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("glm4v") / "model", "glm4v", weights=False)


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("clips")
    out = {}
    for seed, (name, (file, frames, size, fps, fourcc)) in enumerate(CLIPS.items()):
        raw = make_clip(tmp, file, frames, size, fps, fourcc, seed)
        out[name] = data_uri(raw, MIME[file.rpartition(".")[2]])
    # the same 5 frames' size as a frame list: transformers sees 5 (no resampling), 140x168
    out["frame list"] = jpeg_frames(5, (170, 138), 9)
    return out


@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float32"])
@pytest.mark.parametrize("name", [*CLIPS, "frame list"])
def test_tensors_prompt_and_range_equal_vllm_s(model, clips, name, raw):
    # vLLM takes one video a prompt for GLM-4.1V (its supported limit): a chat per clip.
    want = vllm_video_inputs(model, [clips[name]], dtype="float32", mm_device_do_normalize=raw)
    prepared = gateway_video_inputs(model, [clips[name]], raw)
    (part,) = prepared.parts
    tensors = part.processed.tensors
    (item,) = want["video"]
    expected = item["pixel_values_videos"]
    have = tensors["pixel_values"]
    assert have.dtype == expected.dtype == (np.uint8 if raw else np.float32)
    assert have.shape == expected.shape
    assert np.array_equal(have, expected)
    assert tensors["video_grid_thw"].tolist() == [item["video_grid_thw"].tolist()]
    assert tensors["patches_per_video"].tolist() == [len(expected)]
    assert prepared.prompt_ids == want["prompt_token_ids"]
    assert part.ranges == want["ranges"]["video"]


def test_the_clips_take_each_of_vllm_s_paths(model, clips):
    """The cases above are what they claim: the loader's own picks, or every frame (then
    transformers samples again, an odd count made even), or the frame list's."""
    proc = load_processor(model, "video")
    settings = proc.resolve({})

    def picked(name):
        pick = lambda t, f: proc.pick_frames(t, f, settings, VideoSampling())  # noqa: E731
        return load_video(clips[name], None, MediaPolicy(), pick).clip

    assert picked("7.5fps").indices == [0, 4]  # Qwen2-VL's loader would take 4 frames
    assert picked("capped").indices == list(range(0, 40, 4))
    for name, count in (("3 frames", 3), ("5 frames, all kept", 5)):
        clip = picked(name)
        assert clip.indices == list(range(count)) and clip.total_frames == count
    assert picked("frame list").frame_list


def test_a_clip_under_one_frame_pair_fails_as_in_vllm(model, tmp_path):
    """0.6 s at 5 fps: the loader keeps one frame of three, which transformers' smart_resize
    refuses (fewer frames than the temporal patch); the gateway refuses it before decoding."""
    uri = data_uri(make_clip(tmp_path, "short.mp4", 3, (64, 64), 5, "mp4v", 7), MIME["mp4"])
    with pytest.raises(Exception) as failed:
        vllm_video_inputs(model, [uri], dtype="float32")
    causes = [failed.value]
    while causes[-1].__cause__ is not None:
        causes.append(causes[-1].__cause__)
    assert any("t:1 must be larger than temporal_factor:2" in str(e) for e in causes)
    proc = load_processor(model, "video")
    settings = proc.resolve({})
    with pytest.raises(MediaDecodeError, match="needs at least 2"):
        load_video(
            uri, None, MediaPolicy(), lambda t, f: proc.pick_frames(t, f, settings, VideoSampling())
        )


def test_glm_4_6v_s_own_video_processor_is_not_taken_for_4_1v_s(tmp_path):
    """GLM-4.6V's checkpoints name Glm46VVideoProcessor: another vLLM loader, other
    timestamps; no video family here serves them (its images still are)."""
    from gateway.render.model_files import ModelFiles

    files = ModelFiles.load(build_model(tmp_path / "moe", "glm4v_moe", weights=False))
    assert files.video_preprocessor["video_processor_type"] == "Glm46VVideoProcessor"
    assert not Glm4vVideoProcessor.matches(files)
    assert set(processors_for(files).by_modality) == {"image"}


def test_one_video_a_prompt_as_vllm_takes(model, clips):
    """vLLM's supported limit for GLM-4.1V is one video, whatever the server's limit."""
    two = [clips["7.5fps"], clips["3 frames"]]
    with pytest.raises(Exception, match="At most 1 video"):
        vllm_video_inputs(model, two, dtype="float32", limit_mm_per_prompt={"video": 2})
    with pytest.raises(MmgateError, match="At most 1 video"):
        gateway_video_inputs(model, two, raw_pixels=True)


@pytest.mark.sampled  # each case asks vLLM's processor: a sample in the fast loop
@pytest.mark.parametrize("media_io", [{"fps": 1}, {"fps": 4, "num_frames": 3}, {"fps": 0.5}])
def test_a_request_s_sampling_equals_vllm_s(model, clips, media_io):
    """media_io_kwargs.video.fps: the dynamic loader's rate (num_frames it ignores)."""
    uri = [clips["capped"]]  # 40 frames at 8 fps: 5 s
    want = vllm_video_inputs(model, uri, dtype="float32", media_io_kwargs={"video": media_io})
    prepared = gateway_video_inputs(model, uri, True, media_io=media_io)
    assert prepared.prompt_ids == want["prompt_token_ids"]
    (item,) = want["video"]
    have = prepared.parts[0].processed.tensors["pixel_values"]
    assert np.array_equal(have, item["pixel_values_videos"])
