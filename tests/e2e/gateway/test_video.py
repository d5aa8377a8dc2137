"""Video on the tiny Qwen2-VL, both ways, equal to vLLM's own OpenAI server:

- "gateway": `mmgate serve` (auto) decodes the frames vLLM's Qwen2 loader picks and
  preprocesses them itself (`multimodal.processors.qwen_vl_video`), sending tensors;
- "worker": `mmgate serve --mm-processing worker` checks each clip and forwards it as
  `media_refs` to `mmgate engine --mm-processor inprocess`, which runs vLLM's own loader and
  processor (the path of every video model the gateway has no family for).

Clips are made here with OpenCV, of odd sizes, rates and containers."""

from __future__ import annotations

import base64

import httpx
import pytest

from tests.support.e2e_cases import IMAGE, QWEN2VL_LIMITS, png_bytes
from tests.support.gateway_process import GatewayProcess
from tests.support.video_e2e import (
    REFERENCE_NAME,
    assert_same_answer,
    assert_short_video_refused,
    chat,
    data_uri,
    image,
    jpeg_frames,
    make_clip,
    processed_here,
    text,
    video,
)

MAX_VIDEO_BYTES = 500_000  # the auto gateway's --max-video-bytes


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("clips")
    return {
        "mp4": data_uri(make_clip(tmp, "a.mp4", 10, (90, 66), 5, "mp4v", 1), "video/mp4"),
        "avi": data_uri(make_clip(tmp, "b.avi", 8, (70, 94), 4, "MJPG", 2), "video/x-msvideo"),
        "long": data_uri(make_clip(tmp, "c.mp4", 12, (122, 58), 8, "mp4v", 3), "video/mp4"),
        "frames": jpeg_frames(4, (64, 48), 4),
        "webm": data_uri(make_clip(tmp, "f.webm", 11, (100, 62), 6, "VP80", 7), "video/webm"),
        # 800 frames at 2 fps: 800 wanted at vLLM's 2 fps, capped at its loader's 768
        "past-cap": data_uri(make_clip(tmp, "g.mp4", 800, (32, 32), 2, "mp4v", 8), "video/mp4"),
        "one-frame": data_uri(make_clip(tmp, "d.mp4", 1, (90, 66), 5, "mp4v", 5), "video/mp4"),
        "big": data_uri(make_clip(tmp, "e.avi", 40, (320, 240), 8, "MJPG", 6), "video/x-msvideo"),
    }


@pytest.fixture(scope="module")
def engines(qwen2vl_pair):
    """The session's Qwen2-VL pair (tests/e2e/gateway/conftest.py), limits QWEN2VL_LIMITS."""
    return {"vllm": qwen2vl_pair.vllm, "ours": qwen2vl_pair.ours}


@pytest.fixture(scope="module")
def gateways(vision_model, engines, tmp_path_factory):
    logs = tmp_path_factory.mktemp("video-gw")
    worker = [engines["ours"].address]
    limit = ("--max-video-bytes", str(MAX_VIDEO_BYTES))
    started = {
        "gateway": GatewayProcess(
            vision_model, worker, logs / "gateway.log", *limit, "--trust-request-mm-kwargs"
        ),
        "worker": GatewayProcess(
            vision_model, worker, logs / "worker.log", *limit, "--mm-processing", "worker"
        ),
    }
    try:
        yield {name: gateway.wait_ready() for name, gateway in started.items()}
    finally:
        for gateway in started.values():
            gateway.stop()


PATHS = ("gateway", "worker")
CASES = {
    "alone": lambda c: [video(c["mp4"]), text("Describe.")],
    "around-text": lambda c: [text("First this:"), video(c["avi"]), text("What moves?")],
    "odd-rate": lambda c: [video(c["long"]), text("Describe.")],
    "frame-list": lambda c: [video(c["frames"]), text("Describe.")],
    "webm": lambda c: [video(c["webm"]), text("Describe.")],
    "past-the-frame-cap": lambda c: [video(c["past-cap"]), text("Describe.")],
    "with-image": lambda c: [image(data_uri(png_bytes(IMAGE), "image/png")), video(c["mp4"])],
    "two-videos": lambda c: [video(c["avi"]), text("and"), video(c["long"]), text("Compare.")],
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", list(CASES))
def test_a_video_equals_vllm_s_server(case, path, clips, engines, gateways, vision_model):
    content = CASES[case](clips)
    want = chat(engines["vllm"].base_url, REFERENCE_NAME, content)
    got = chat(gateways[path].base_url, str(vision_model), content)
    assert_same_answer(got, want)


def error_of(reply: httpx.Response) -> str:
    return reply.json()["error"]["message"]


@pytest.mark.parametrize("path", PATHS)
def test_who_preprocesses_the_videos(path, clips, gateways, vision_model):
    before = processed_here(gateways[path].base_url)
    reply = chat(gateways[path].base_url, str(vision_model), [video(clips["mp4"])])
    assert reply.status_code == 200, reply.text
    assert processed_here(gateways[path].base_url) - before == (path == "gateway")


@pytest.mark.parametrize("path", PATHS)
def test_a_video_over_the_byte_limit_is_a_400(path, clips, gateways, vision_model):
    assert len(clips["big"]) * 3 // 4 > MAX_VIDEO_BYTES
    reply = chat(gateways[path].base_url, str(vision_model), [video(clips["big"])])
    assert reply.status_code == 400, reply.text
    assert "video 0: video exceeds the" in error_of(reply)


@pytest.mark.parametrize("path", PATHS)
def test_more_videos_than_the_limit_is_a_400(path, clips, gateways, vision_model):
    content = [video(clips["mp4"])] * (QWEN2VL_LIMITS["video"] + 1)
    reply = chat(gateways[path].base_url, str(vision_model), content)
    assert reply.status_code == 400, reply.text
    assert "At most 2 video(s)" in error_of(reply)


@pytest.mark.parametrize(
    "url",
    [
        data_uri(b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 8, "video/mp4"),
        data_uri(bytes(range(256)) * 8, "video/mp4"),
        "data:video/jpeg;base64,AAAA,BBBB",
        "data:image/png;base64," + base64.b64encode(png_bytes(IMAGE)).decode(),
    ],
    ids=["damaged-mp4", "not-a-container", "bad-frames", "image-labelled"],
)
@pytest.mark.parametrize("path", PATHS)
def test_garbage_labelled_video_is_a_4xx(path, url, gateways, vision_model):
    reply = chat(gateways[path].base_url, str(vision_model), [video(url)])
    assert 400 <= reply.status_code < 500, reply.text
    assert error_of(reply).startswith("invalid video: video 0: ")


@pytest.mark.parametrize("path", PATHS)
def test_a_one_frame_clip_is_served_or_refused_with_a_4xx(
    path, clips, engines, gateways, vision_model
):
    content = [video(clips["one-frame"]), text("Describe.")]
    reply = chat(gateways[path].base_url, str(vision_model), content)
    assert reply.status_code == 200 or 400 <= reply.status_code < 500, reply.text
    # What vLLM's own server does with it, for the record (it refuses every one-frame clip).
    theirs = chat(engines["vllm"].base_url, REFERENCE_NAME, content)
    print(
        f"one-frame clip: mmgate {reply.status_code} {reply.text[:200]!r}; "
        f"vLLM {theirs.status_code} {theirs.text[:200]!r}"
    )


def test_a_video_placeholder_one_embedding_short_is_refused_by_the_worker(
    clips, engines, vision_model
):
    assert_short_video_refused(vision_model, engines["ours"], clips["mp4"])


def test_tokenize_expands_a_video_as_vllm_s_server_does(clips, engines, gateways, vision_model):
    messages = [{"role": "user", "content": [video(clips["avi"]), text("Describe.")]}]
    want = httpx.post(
        f"{engines['vllm'].base_url}/tokenize",
        json={"model": REFERENCE_NAME, "messages": messages},
        timeout=120,
    )
    got = httpx.post(
        f"{gateways['gateway'].base_url}/tokenize",
        json={"model": str(vision_model), "messages": messages},
        timeout=120,
    )
    assert want.status_code == 200, want.text
    assert got.status_code == 200, got.text
    assert got.json()["tokens"] == want.json()["tokens"]


@pytest.mark.parametrize(
    ("clip", "media_io"),
    [("long", {"fps": 4}), ("frames", {"fps": 2, "num_frames": 3})],
    ids=["fps", "frame-list-fps-and-count"],
)
def test_a_request_s_video_sampling_equals_vllm_s_server(
    clip, media_io, clips, engines, gateways, vision_model
):
    content = [video(clips[clip]), text("Describe.")]
    fields = {"media_io_kwargs": {"video": media_io}}
    want = chat(engines["vllm"].base_url, REFERENCE_NAME, content, **fields)
    got = chat(gateways["gateway"].base_url, str(vision_model), content, **fields)
    assert_same_answer(got, want)
    default = chat(gateways["gateway"].base_url, str(vision_model), content)
    # the sampling did change the frames (and so what the model saw)
    first = [r.json()["choices"][0]["logprobs"]["content"][0]["logprob"] for r in (default, got)]
    assert first[0] != first[1]


@pytest.mark.parametrize(
    ("media_io", "says"),
    [
        ({"video": {"fps": 0}}, "media_io_kwargs.video.fps must be a positive number"),
        ({"video": {"backend": "torchcodec"}}, "media_io_kwargs.video.backend is not supported"),
        ({"image": {}}, "media_io_kwargs.image: only video loader options are supported"),
    ],
)
def test_video_sampling_the_gateway_does_not_reproduce_is_a_400(
    media_io, says, clips, gateways, vision_model
):
    content = [video(clips["mp4"])]
    reply = chat(gateways["gateway"].base_url, str(vision_model), content, media_io_kwargs=media_io)
    assert reply.status_code == 400, reply.text
    assert says in error_of(reply)


def test_video_sampling_is_refused_without_trust_as_vllm_refuses_it(clips, gateways, vision_model):
    fields = {"media_io_kwargs": {"video": {"fps": 1}}}
    reply = chat(gateways["worker"].base_url, str(vision_model), [video(clips["mp4"])], **fields)
    assert reply.status_code == 400, reply.text
    assert "Start the server with --trust-request-mm-kwargs" in error_of(reply)
    assert reply.json()["error"]["param"] == "media_io_kwargs"
