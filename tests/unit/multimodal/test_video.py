"""The gateway's checks of a video before a worker decodes it (multimodal.video): container,
frames, size, bytes, and vLLM's data:video/jpeg frame lists. Clips are made here by OpenCV."""

from __future__ import annotations

import base64
import io

import cv2
import numpy as np
import pytest
from PIL import Image

from multimodal.errors import MediaDecodeError, MediaError, MediaSourceError, MediaTooLargeError
from multimodal.policy import MediaPolicy
from multimodal.video import checked_video, load_video, probe_video, sniff_container


def clip(tmp_path, frames=6, size=(90, 66), fps=5.0, name="c.mp4", fourcc="mp4v") -> bytes:
    width, height = size
    path = tmp_path / name
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*fourcc), fps, (width, height))
    rng = np.random.default_rng(frames)
    for _ in range(frames):
        writer.write(rng.integers(0, 255, (height, width, 3), dtype=np.uint8))
    writer.release()
    return path.read_bytes()


def data_url(raw: bytes, mime: str = "video/mp4") -> str:
    return f"data:{mime};base64,{base64.b64encode(raw).decode()}"


def jpeg(width=16, height=12) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (1, 2, 3)).save(buffer, format="JPEG")
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("name", "fourcc", "mime"),
    [("a.mp4", "mp4v", "video/mp4"), ("b.avi", "MJPG", "video/x-msvideo")],
)
def test_a_clip_is_forwarded_as_its_checked_bytes_with_the_sniffed_type(
    tmp_path, name, fourcc, mime
):
    raw = clip(tmp_path, name=name, fourcc=fourcc)
    assert sniff_container(raw) == mime
    # the declared type is the client's; the forwarded one is sniffed
    assert checked_video(data_url(raw, "video/whatever"), None, MediaPolicy()) == data_url(
        raw, mime
    )
    assert probe_video(raw).frames == 6
    assert (probe_video(raw).width, probe_video(raw).height) == (90, 66)


def test_downloaded_bytes_are_checked_as_they_came(tmp_path):
    raw = clip(tmp_path)
    assert checked_video("https://example.com/a.mp4", raw, MediaPolicy()) == data_url(raw)


def test_sniffing_knows_the_containers_vllm_reads():
    assert sniff_container(b"\0\0\0\x14ftypqt  \0\0\0\0") == "video/quicktime"
    assert sniff_container(b"\x1a\x45\xdf\xa3\x9f\x42\x82\x84webm") == "video/webm"
    assert sniff_container(b"\x1a\x45\xdf\xa3\x9f\x42\x82\x88matroska") == "video/x-matroska"
    assert sniff_container(b"RIFF\0\0\0\0AVI LIST") == "video/x-msvideo"
    assert sniff_container(b"\x89PNG\r\n\x1a\n") is None


def test_the_byte_limit_is_the_video_s(tmp_path):
    raw = clip(tmp_path)
    small = MediaPolicy(max_video_bytes=len(raw) - 1)
    with pytest.raises(MediaTooLargeError, match="video exceeds the") as info:
        checked_video(data_url(raw), None, small)
    assert info.value.kind == "video"
    # the image limit does not apply to a video, and the video limit not to an image
    assert checked_video(data_url(raw), None, MediaPolicy(max_bytes=100))


@pytest.mark.parametrize(
    ("url", "error", "reason"),
    [
        (data_url(b"garbage" * 100), MediaDecodeError, "not a supported video container"),
        (data_url(b"\0\0\0\x18ftypmp42" + b"x" * 500), MediaDecodeError, "cannot be opened"),
        ("data:image/png;base64,AAAA", MediaSourceError, "must be video/"),
        ("data:video/mp4,plain", MediaSourceError, "base64"),
    ],
    ids=["no-container", "damaged", "image-type", "not-base64"],
)
def test_what_is_not_a_video_is_refused(url, error, reason):
    with pytest.raises(error, match=reason):
        checked_video(url, None, MediaPolicy())


def test_a_one_frame_clip_is_refused_as_vllm_cannot_read_it(tmp_path):
    with pytest.raises(MediaDecodeError, match="1 frame.*at least 2"):
        checked_video(data_url(clip(tmp_path, frames=1)), None, MediaPolicy())


def test_frames_beyond_the_pixel_limit_are_refused(tmp_path):
    with pytest.raises(MediaTooLargeError, match="90x66.*pixel limit"):
        checked_video(data_url(clip(tmp_path)), None, MediaPolicy(max_pixels=90 * 66 - 1))


def test_a_frame_list_is_checked_frame_by_frame_and_kept_a_list():
    frames = [base64.b64encode(jpeg()).decode(), base64.b64encode(jpeg(9, 7)).decode()]
    url = "data:video/jpeg;base64," + ",".join(frames)
    assert checked_video(url, None, MediaPolicy()) == url
    with pytest.raises(MediaDecodeError, match="frame 1: "):
        checked_video(f"data:video/jpeg;base64,{frames[0]},AAAA", None, MediaPolicy())
    with pytest.raises(MediaSourceError, match="frame 0 .*base64"):
        checked_video("data:video/jpeg;base64,@@@@", None, MediaPolicy())
    with pytest.raises(MediaTooLargeError, match="video exceeds"):
        checked_video(url, None, MediaPolicy(max_video_bytes=len(jpeg()) + 10))
    with pytest.raises(MediaTooLargeError, match="frame 0: "):
        checked_video(url, None, MediaPolicy(max_pixels=100))


def test_errors_name_the_video():
    error = MediaDecodeError("broken", index=1, kind="video")
    assert error.message == "invalid video: video 1: broken"
    assert MediaError("x", index=0).message == "invalid image: image 0: x"


def test_the_video_policy_keeps_every_other_rule():
    policy = MediaPolicy(allowed_networks=("10.0.0.0/8",), max_video_bytes=5)
    video = policy.for_video()
    assert (video.max_bytes, video.media_kind, video.allowed_networks) == (
        5,
        "video",
        policy.allowed_networks,
    )
    with pytest.raises(ValueError, match="max_video_bytes"):
        MediaPolicy(max_video_bytes=0)


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        (MediaPolicy(max_video_frames=5), "the video has 6 frames, above the 5 frame limit"),
        (MediaPolicy(max_video_seconds=1.1), "the video lasts 1.2 s, above the 1.1 s limit"),
    ],
    ids=["frames", "seconds"],
)
def test_a_clip_past_the_frame_or_length_limit_is_refused_on_both_paths(tmp_path, policy, message):
    url = data_url(clip(tmp_path))  # 6 frames at 5 fps
    with pytest.raises(MediaTooLargeError, match=message):
        checked_video(url, None, policy)
    with pytest.raises(MediaTooLargeError, match=message):
        load_video(url, None, policy, lambda total, fps: list(range(total)))


def test_decoding_past_the_time_limit_is_refused(tmp_path, monkeypatch):
    import multimodal.video as video

    url = data_url(clip(tmp_path, frames=8))
    clock = iter(range(0, 1000, 10))  # every reading 10 s later
    monkeypatch.setattr(video.time, "monotonic", lambda: next(clock))
    policy = MediaPolicy(video_decode_timeout=25)
    with pytest.raises(MediaTooLargeError, match="took longer than the 25 s limit"):
        load_video(url, None, policy, lambda total, fps: list(range(total)))


def test_load_video_keeps_the_picked_frames_and_the_clip_facts(tmp_path):
    raw = clip(tmp_path, frames=9, fps=3.0)
    loaded = load_video(data_url(raw), None, MediaPolicy(), lambda total, fps: [0, 4, 8])
    assert loaded.data == raw  # the hash's input: the clip's bytes
    assert loaded.clip.indices == [0, 4, 8]
    assert loaded.clip.frames.shape == (3, 66, 90, 3)
    assert (loaded.clip.total_frames, loaded.clip.fps) == (9, 3.0)


def test_a_frame_list_is_every_frame_at_1_fps_up_to_vllm_s_32():
    frames = ",".join([base64.b64encode(jpeg()).decode()] * 40)
    loaded = load_video(f"data:video/jpeg;base64,{frames}", None, MediaPolicy(), _never)
    assert loaded.clip.indices == list(range(32))
    assert loaded.clip.frames.shape == (32, 12, 16, 3)
    assert (loaded.clip.total_frames, loaded.clip.fps) == (32, 1.0)


def test_a_frame_list_of_two_sizes_is_refused():
    frames = [base64.b64encode(f).decode() for f in (jpeg(), jpeg(20, 10))]
    url = "data:video/jpeg;base64," + ",".join(frames)
    with pytest.raises(MediaDecodeError, match="must all have one size"):
        load_video(url, None, MediaPolicy(), _never)


def test_a_clip_the_loader_cannot_sample_is_a_decode_error(tmp_path):
    def refuse(total: int, fps: float) -> list[int]:
        raise ValueError("the loader needs a known rate")

    with pytest.raises(MediaDecodeError, match="needs a known rate"):
        load_video(data_url(clip(tmp_path)), None, MediaPolicy(), refuse)


def _never(total: int, fps: float) -> list[int]:
    raise AssertionError("a frame list is not sampled")


def test_picked_frames_past_the_decoded_memory_limit_are_refused_before_decoding(tmp_path):
    url = data_url(clip(tmp_path))  # 90x66 frames: 17,820 bytes each in RGB
    every = lambda total, fps: list(range(total))  # noqa: E731
    assert len(load_video(url, None, MediaPolicy(), every).clip.indices) == 6
    policy = MediaPolicy(max_video_decoded_bytes=5 * 17_820)
    with pytest.raises(MediaTooLargeError, match="6 frames of 90x66 take 0 MiB decoded"):
        load_video(url, None, policy, every)
    assert len(load_video(url, None, policy, lambda total, fps: [0, 5]).clip.indices) == 2
