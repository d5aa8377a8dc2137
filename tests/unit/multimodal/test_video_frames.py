"""The frames multimodal.video_frames picks, and multimodal.video_decode decodes, are the
ones vLLM's own Qwen2-VL, Qwen3-VL, GLM-4.1V (`opencv_dynamic`) and default (`opencv`,
e.g. LLaVA-OneVision) video loaders decode. Clips are written here by
OpenCV (MJPG in AVI, so frames decode almost exactly), each frame painted with its own
index so a decoded frame reveals it."""

from __future__ import annotations

import io

import cv2
import numpy as np
import pytest

from multimodal.video_decode import decode_picked_frames
from multimodal.video_frames import glm4v_frames, qwen2_vl_frames, qwen3_vl_frames, uniform_frames

video = pytest.importorskip("vllm.multimodal.video")

# The frame index in two flat gray halves, 16x16 blocks each (aligned with JPEG's blocks):
# left = index // 16, right = index % 16, each level 16 * digit + 8.
_HEIGHT, _WIDTH = 16, 32


def _frame(index: int) -> np.ndarray:
    frame = np.empty((_HEIGHT, _WIDTH, 3), dtype=np.uint8)
    frame[:, :16] = 16 * (index // 16) + 8
    frame[:, 16:] = 16 * (index % 16) + 8
    return frame


def _index(frame: np.ndarray) -> int:
    high, low = (round((float(half.mean()) - 8) / 16) for half in (frame[:, :16], frame[:, 16:]))
    return 16 * high + low


_CLIPS: dict[tuple[int, float], bytes] = {}


def clip(tmp_path_factory, frames: int, fps: float) -> bytes:
    if (frames, fps) not in _CLIPS:
        path = tmp_path_factory.mktemp("clips") / f"{frames}_{fps}.avi"
        fourcc = cv2.VideoWriter_fourcc(*"MJPG")
        writer = cv2.VideoWriter(str(path), fourcc, fps, (_WIDTH, _HEIGHT))
        for index in range(frames):
            writer.write(_frame(index))
        writer.release()
        _CLIPS[frames, fps] = path.read_bytes()
    return _CLIPS[frames, fps]


def vllm_frames(processor: str | None, data: bytes, **media_io_kwargs) -> list[int]:
    """The source indices vLLM's loader for ``processor`` (None: the default loader)
    decodes, called as VideoMediaIO calls it (``num_frames`` 32 unless the request sets it),
    read from the frames' pixels and checked against the loader's metadata."""
    backend = video.get_video_loader_backend_for_processor(processor) or "opencv"
    loader = video.VIDEO_LOADER_REGISTRY.load(backend)
    num_frames = media_io_kwargs.pop("num_frames", 32)
    frames, metadata = loader.load_bytes(data, num_frames=num_frames, **media_io_kwargs)
    decoded = [_index(frame) for frame in frames]
    assert decoded == metadata["frames_indices"]
    return decoded


def facts(data: bytes) -> tuple[int, float]:
    """Frame count (after the seek-to-end correction) and rate, as vLLM's loader reads them."""
    from vllm.multimodal.video_decoders.opencv import OpenCVVideoBackendMixin as OpenCV

    stream = io.BytesIO(data)  # must outlive the capture, which reads it until release()
    capture = cv2.VideoCapture(stream, OpenCV.get_cv2_video_api(), [])
    try:
        source = OpenCV.get_video_metadata(capture)
    finally:
        capture.release()
    return source.total_frames_num, source.original_fps


LENGTHS = [2, 3, 7, 16, 17, 45, 100]
RATES = [2.0, 2.4, 7.5, 24.0, 30.0]
REQUESTS = [{}, {"fps": 1}, {"fps": 5.5}, {"fps": 60}, {"num_frames": 5}]


@pytest.mark.parametrize("frames", LENGTHS)
@pytest.mark.parametrize("rate", RATES)
def test_qwen2_vl_picks_vllms_frames(tmp_path_factory, frames, rate):
    data = clip(tmp_path_factory, frames, rate)
    total, source_fps = facts(data)
    assert total == frames
    for request in REQUESTS:
        expected = vllm_frames("Qwen2VLVideoProcessor", data, **request)
        fps = request.get("fps", 2)
        assert qwen2_vl_frames(total, source_fps, fps=fps) == expected, request


@pytest.mark.parametrize("frames", LENGTHS)
@pytest.mark.parametrize("rate", RATES)
def test_qwen3_vl_picks_vllms_frames(tmp_path_factory, frames, rate):
    data = clip(tmp_path_factory, frames, rate)
    total, source_fps = facts(data)
    for request in REQUESTS:
        expected = vllm_frames("Qwen3VLVideoProcessor", data, **request)
        fps = request.get("fps", 2)
        assert qwen3_vl_frames(total, source_fps, fps=fps) == expected, request


@pytest.mark.parametrize("frames", LENGTHS)
@pytest.mark.parametrize("rate", RATES)
def test_glm4v_picks_vllms_frames(tmp_path_factory, frames, rate):
    data = clip(tmp_path_factory, frames, rate)
    total, source_fps = facts(data)
    for request in REQUESTS:
        fps = request.get("fps", 2)
        try:
            expected = vllm_frames("Glm4vVideoProcessor", data, **request)
        except ValueError:  # under one frame at this rate: vLLM's read fails, we refuse
            with pytest.raises(ValueError, match="too short"):
                glm4v_frames(total, source_fps, fps=fps)
        else:
            assert glm4v_frames(total, source_fps, fps=fps) == expected, request


def test_glm4v_samples_a_long_clip_at_evenly_spaced_seconds(tmp_path_factory):
    """Beyond max_duration (300 s; 6 s here, as --media-io-kwargs may set it) the loader
    takes max_duration * fps frames spread over the whole clip."""
    data = clip(tmp_path_factory, 100, 7.5)  # 13.3 s
    total, source_fps = facts(data)
    expected = vllm_frames("Glm4vVideoProcessor", data, max_duration=6)
    assert glm4v_frames(total, source_fps, max_duration=6) == expected
    assert len(expected) == 12 and expected[-1] == 99


@pytest.mark.parametrize("frames", LENGTHS)
def test_the_default_loader_picks_vllms_frames(tmp_path_factory, frames):
    data = clip(tmp_path_factory, frames, 24.0)
    total, _ = facts(data)
    assert uniform_frames(total) == vllm_frames(None, data)
    assert uniform_frames(total, 5) == vllm_frames(None, data, num_frames=5)
    # LLaVA-OneVision names a video processor with no loader of its own
    assert video.get_video_loader_backend_for_processor("LlavaOnevisionVideoProcessor") is None


def test_sampling_options_from_media_io_kwargs(tmp_path_factory):
    data = clip(tmp_path_factory, 100, 30.0)
    total, source_fps = facts(data)
    options = {"fps": 30, "min_frames": 2, "max_frames": 10}
    assert qwen2_vl_frames(total, source_fps, **options) == vllm_frames(
        "Qwen2VLVideoProcessor", data, **options
    )
    assert qwen3_vl_frames(total, source_fps, **options) == vllm_frames(
        "Qwen3VLVideoProcessor", data, **options
    )


def test_the_rules_the_issue_states():
    # Qwen2/2.5: an even count in even steps, short of the last frame; 3 frames give 2.
    assert qwen2_vl_frames(3, 30.0) == [0, 1]
    assert qwen2_vl_frames(100, 30.0) == [0, 16, 33, 50, 66, 83]
    # ...except where float32 steps add one: 17 frames at 2.4 fps give 15, the last included.
    assert qwen2_vl_frames(17, 2.4) == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 12, 13, 14, 15, 16]
    # Qwen3: evenly spaced, rounded, ending on the last frame, at least 4 (the clip allowing).
    assert qwen3_vl_frames(100, 30.0) == [0, 20, 40, 59, 79, 99]
    assert qwen3_vl_frames(45, 30.0) == [0, 15, 29, 44]
    assert qwen3_vl_frames(3, 30.0) == [0, 1, 2]


def test_where_vllm_fails_we_refuse():
    with pytest.raises(ValueError):
        qwen2_vl_frames(1, 30.0)  # vLLM divides by zero (a 500)
    with pytest.raises(ValueError):
        qwen2_vl_frames(30, 0.0)
    assert qwen3_vl_frames(48, 0.0) == qwen3_vl_frames(48, 24.0)


def test_float32_arange_matches_torch():
    torch = pytest.importorskip("torch")
    from multimodal.video_frames import _torch_float32_arange

    for total in range(2, 400):
        for count in range(2, total + 1, 2):
            step = total / count
            expected = torch.arange(0, total, step).int().tolist()
            assert _torch_float32_arange(total, step).tolist() == expected, (total, count)


@pytest.mark.parametrize(
    ("processor", "pick"),
    [("Qwen2VLVideoProcessor", qwen2_vl_frames), ("Qwen3VLVideoProcessor", qwen3_vl_frames)],
)
@pytest.mark.parametrize(("frames", "rate"), [(2, 7.5), (17, 2.4), (45, 30.0), (100, 24.0)])
def test_decoded_frames_are_vllms(tmp_path_factory, processor, pick, frames, rate):
    data = clip(tmp_path_factory, frames, rate)
    backend = video.get_video_loader_backend_for_processor(processor)
    expected, metadata = video.VIDEO_LOADER_REGISTRY.load(backend).load_bytes(data, num_frames=32)
    decoded = decode_picked_frames(data, pick)
    assert decoded.indices == metadata["frames_indices"]
    assert (decoded.total_frames, decoded.fps) == (metadata["total_num_frames"], metadata["fps"])
    assert decoded.frames.dtype == np.uint8
    np.testing.assert_array_equal(decoded.frames, expected)


def test_decoding_an_mp4_clip(tmp_path_factory):
    path = tmp_path_factory.mktemp("mp4") / "c.mp4"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 24.0, (_WIDTH, _HEIGHT))
    for index in range(30):
        writer.write(_frame(index))
    writer.release()
    data = path.read_bytes()
    expected, metadata = video.VIDEO_LOADER_REGISTRY.load("qwen3_vl").load_bytes(data)
    decoded = decode_picked_frames(data, qwen3_vl_frames)
    assert decoded.indices == metadata["frames_indices"] == [0, 10, 19, 29]
    np.testing.assert_array_equal(decoded.frames, expected)


def test_a_one_frame_clip_decodes_no_frame_as_in_vllm(tmp_path_factory):
    # vLLM's seek to the end and back leaves a one-frame clip's only frame unreadable.
    data = clip(tmp_path_factory, 1, 24.0)
    _, metadata = video.VIDEO_LOADER_REGISTRY.load("qwen3_vl").load_bytes(data)
    decoded = decode_picked_frames(data, qwen3_vl_frames)
    assert decoded.indices == metadata["frames_indices"] == []
    assert decoded.frames.shape == (0, _HEIGHT, _WIDTH, 3)
    with pytest.raises(ValueError):
        decode_picked_frames(data, qwen2_vl_frames)
