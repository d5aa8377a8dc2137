"""What the video tests share: clips made with OpenCV at test time, a greedy chat with
logprobs, and the comparison with vLLM's own server (prompt tokens, text, logprobs within
1e-5)."""

from __future__ import annotations

import base64
from pathlib import Path

import cv2
import httpx
import numpy as np

REFERENCE_NAME = "tiny"  # the name vLLM's server answers to (VllmServerProcess)
LOGPROB_TOLERANCE = 1e-5


def make_clip(
    tmp: Path, name: str, frames: int, size: tuple[int, int], fps: float, fourcc: str, seed: int
) -> bytes:
    """A clip of moving gradients with noise, encoded by OpenCV into `name`'s container."""
    width, height = size
    path = tmp / name
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*fourcc), fps, (width, height))
    assert writer.isOpened(), name
    rng = np.random.default_rng(seed)
    x = np.linspace(0, 255, width, dtype=np.float32)[None, :, None]
    for k in range(frames):
        noise = rng.integers(0, 48, (height, width, 3)).astype(np.float32)
        frame = np.clip((x + 23 * k) % 256 + noise, 0, 255).astype(np.uint8)
        writer.write(frame)
    writer.release()
    return path.read_bytes()


def data_uri(data: bytes, mime: str) -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def jpeg_frames(frames: int, size: tuple[int, int], seed: int) -> str:
    """vLLM's frame list: data:video/jpeg;base64,<jpeg>,<jpeg>,..."""
    rng = np.random.default_rng(seed)
    width, height = size
    encoded = []
    for _ in range(frames):
        frame = rng.integers(0, 255, (height, width, 3), dtype=np.uint8)
        ok, jpeg = cv2.imencode(".jpg", frame)
        assert ok
        encoded.append(base64.b64encode(jpeg.tobytes()).decode())
    return "data:video/jpeg;base64," + ",".join(encoded)


def video(url: str) -> dict:
    return {"type": "video_url", "video_url": {"url": url}}


def image(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def text(value: str) -> dict:
    return {"type": "text", "text": value}


def chat(base_url: str, model: str, content: list[dict], **fields) -> httpx.Response:
    """A greedy 8-token chat with logprobs; `fields`: more of the request's fields."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "temperature": 0,
        "max_tokens": 8,
        "ignore_eos": True,
        "logprobs": True,
        **fields,
    }
    return httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=300)


def assert_same_answer(got: httpx.Response, want: httpx.Response) -> None:
    """The same prompt token count, greedy text and tokens, logprobs within 1e-5."""
    assert want.status_code == 200, want.text
    assert got.status_code == 200, got.text
    want, got = want.json(), got.json()
    assert got["usage"]["prompt_tokens"] == want["usage"]["prompt_tokens"]
    assert got["choices"][0]["message"]["content"] == want["choices"][0]["message"]["content"]
    ours = got["choices"][0]["logprobs"]["content"]
    theirs = want["choices"][0]["logprobs"]["content"]
    assert [t["token"] for t in ours] == [t["token"] for t in theirs]
    for a, b in zip(ours, theirs, strict=True):
        assert abs(a["logprob"] - b["logprob"]) <= LOGPROB_TOLERANCE, (a, b)


def short_video_request(model: Path, worker, uri: str):
    """One video preprocessed by the gateway's code for `worker`'s pixel encoding, with one
    embedding token taken out of its placeholder (the ids and the range both one shorter):
    the worker's slot check must refuse it before the engine core sees it."""
    from gateway.render.model_files import ModelFiles
    from gateway.render.renderer import ChatRenderer
    from multimodal.media import MediaPolicy
    from multimodal.pipeline import PixelEncoding, decode_items, prepare
    from multimodal.registry import processors_for
    from protos import vllm_engine_pb2 as pb
    from tests.support.family_e2e import shortened_request

    files = ModelFiles.load(model)
    processors = processors_for(files)
    messages = [{"role": "user", "content": [video(uri), text("Describe.")]}]
    rendered = ChatRenderer(files, processors.placeholders).render(messages)
    info = worker.stub().GetServerInfo(pb.GetServerInfoRequest(), timeout=10)
    encoding = PixelEncoding.for_engine(info.mm_device_do_normalize, info.multimodal_encoder_dtype)
    processor = processors.get("video")
    items = decode_items(processor, [uri], [None], processor.defaults, MediaPolicy())
    prepared = prepare([(processor, items)], rendered.token_ids, {}, encoding)
    return shortened_request(prepared, processor.anchor_token_id, "short-video-placeholder")


def assert_short_video_refused(model: Path, worker, uri: str) -> None:
    """The worker refuses a video placeholder one embedding short with INVALID_ARGUMENT and
    keeps serving."""
    import grpc
    import pytest

    from protos import vllm_engine_pb2 as pb

    request = short_video_request(model, worker, uri)
    with pytest.raises(grpc.RpcError) as refused:
        list(worker.stub().Generate(request, timeout=60))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value.details()
    assert "video item 0 has" in refused.value.details()
    assert worker.stub().HealthCheck(pb.HealthCheckRequest(), timeout=10).healthy


def processed_here(base_url: str) -> float:
    """How many requests' media the gateway preprocessed itself (the "process" stage)."""
    metrics = httpx.get(f"{base_url}/metrics", timeout=10).text
    prefix = 'mmgate_preprocess_duration_seconds_count{stage="process"} '
    return sum(
        float(line[len(prefix) :]) for line in metrics.splitlines() if line.startswith(prefix)
    )
