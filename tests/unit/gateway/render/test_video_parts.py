"""`video_url` content parts: their items, the placeholders vLLM writes for them, and the
media_refs a worker gets (gateway.render.messages, gateway.render.worker_media)."""

from __future__ import annotations

import asyncio
import base64
import io

import cv2
import numpy as np
import pytest
from PIL import Image

from gateway.errors import ChatRequestError
from gateway.render.messages import MediaItem, to_conversation
from gateway.render.worker_media import fallback_placeholders, media_refs
from multimodal.errors import MediaError
from multimodal.media import MediaPolicy
from protos import common_pb2

QWEN2_VL = ("Qwen2VLForConditionalGeneration",)
IMAGE_TEXT = "<|vision_start|><|image_pad|><|vision_end|>"
VIDEO_TEXT = "<|vision_start|><|video_pad|><|vision_end|>"
PLACEHOLDERS = {"image": IMAGE_TEXT, "video": VIDEO_TEXT}


def parse(content, fmt="string", placeholders=PLACEHOLDERS, interleave=False):
    messages = [{"role": "user", "content": content}]
    conversation, media = to_conversation(messages, "", fmt, placeholders, interleave)
    return conversation[0]["content"], media


def video(url="data:video/mp4;base64,AAAA", **extra):
    return {"type": "video_url", "video_url": {"url": url}, **extra}


def image(url="data:image/png;base64,AAAA"):
    return {"type": "image_url", "image_url": {"url": url}}


def test_a_video_part_is_an_item_and_vllm_s_placeholder():
    content, media = parse([{"type": "text", "text": "Hi"}, video()])
    assert content == f"{VIDEO_TEXT}\nHi"
    assert media == [MediaItem("video", "data:video/mp4;base64,AAAA")]
    assert media[0].part == "messages[0].content[1]"


def test_openai_format_sees_a_video_part_with_its_extra_keys():
    content, _ = parse([video(extra="kept")], fmt="openai")
    assert content == [{"type": "video", "extra": "kept"}]


def test_without_a_type_a_video_url_key_makes_a_video_and_a_string_url_works():
    _, media = parse([{"video_url": "https://example.com/a.mp4"}])
    assert media == [MediaItem("video", "https://example.com/a.mp4")]


def test_mixed_media_keep_part_order_and_vllm_s_placeholder_grouping():
    # vLLM groups a message's missing placeholders by modality, in first-appearance order
    content, media = parse([video("v1"), image("i1"), video("v2"), {"type": "text", "text": "x"}])
    assert [m.url for m in media] == ["v1", "i1", "v2"]
    assert content == "\n".join([VIDEO_TEXT, VIDEO_TEXT, IMAGE_TEXT, "x"])


def test_interleaved_markers_take_their_own_modality_s_next_placeholder():
    content, _ = parse(
        [{"type": "text", "text": "a"}, video("v"), image("i"), {"type": "text", "text": "b"}],
        interleave=True,
    )
    assert content == "\n".join(["a", VIDEO_TEXT, IMAGE_TEXT, "b"])


def test_a_video_without_url_or_for_a_model_without_video_is_refused():
    with pytest.raises(ChatRequestError, match=r"content\[0\]\.video_url\.url is required"):
        parse([{"type": "video_url", "video_url": {}}])
    with pytest.raises(ChatRequestError, match="does not accept videos"):
        parse([video()], placeholders={"image": IMAGE_TEXT})


def test_fallback_placeholders_know_video_where_vllm_does():
    qwen = fallback_placeholders(QWEN2_VL)
    assert (qwen["image"](1), qwen["video"](1)) == (IMAGE_TEXT, VIDEO_TEXT)
    # LFM2-VL has an image placeholder only: no video part is taken for it
    assert set(fallback_placeholders(("Lfm2VlForConditionalGeneration",))) == {"image"}


def mp4(tmp_path, frames=4) -> bytes:
    path = tmp_path / "a.mp4"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 4, (34, 26))
    for k in range(frames):
        writer.write(np.full((26, 34, 3), 20 * k, np.uint8))
    writer.release()
    return path.read_bytes()


def png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 6), (9, 9, 9)).save(buffer, format="PNG")
    return buffer.getvalue()


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def test_videos_and_images_go_to_the_worker_in_prompt_order(tmp_path):
    clip = mp4(tmp_path)
    items = [
        MediaItem("video", f"data:video/mp4;base64,{b64(clip)}"),
        MediaItem("image", f"data:image/png;base64,{b64(png())}"),
    ]
    out = asyncio.run(media_refs(items, MediaPolicy(), None))
    assert [r.modality for r in out.items] == [common_pb2.VIDEO, common_pb2.IMAGE]
    assert out.items[0].url == f"data:video/mp4;base64,{b64(clip)}"


def test_a_bad_item_is_named_by_its_modality_and_index_among_them(tmp_path):
    items = [
        MediaItem("image", f"data:image/png;base64,{b64(png())}"),
        MediaItem("video", f"data:video/mp4;base64,{b64(mp4(tmp_path))}"),
        MediaItem("video", f"data:video/mp4;base64,{b64(b'nothing' * 10)}"),
    ]
    with pytest.raises(MediaError) as info:
        asyncio.run(media_refs(items, MediaPolicy(), None))
    assert info.value.message.startswith("invalid video: video 1: not a supported video")
    small = MediaPolicy(max_video_bytes=100)
    with pytest.raises(MediaError, match="video 0: video exceeds the 100 bytes size limit"):
        asyncio.run(media_refs(items[:2], small, None))


@pytest.fixture
def builder(vision_model):
    from gateway.render.model_files import ModelFiles
    from gateway.render.prompt import PromptBuilder
    from gateway.render.renderer import ChatRenderer
    from multimodal.registry import processors_for

    def build(**options):
        files = ModelFiles.load(vision_model)
        processors = processors_for(files)
        renderer = ChatRenderer(files, processors.placeholders)
        return PromptBuilder(renderer, processors, MediaPolicy(), **options)

    return build


class _Request:
    tools = chat_template = chat_template_kwargs = mm_processor_kwargs = media_io_kwargs = None
    add_generation_prompt, continue_final_message, add_special_tokens = True, False, False

    def __init__(self, *parts):
        self.messages = [{"role": "user", "content": [*parts, {"type": "text", "text": "Hi"}]}]


def test_the_gateway_prepares_images_and_videos_as_one_group_each(builder, tmp_path):
    from multimodal.pipeline import PixelEncoding

    clip = f"data:video/mp4;base64,{b64(mp4(tmp_path))}"
    still = f"data:image/png;base64,{b64(png())}"
    request = _Request(video(clip), image(still), video(clip))
    prompt = asyncio.run(builder().build(request, PixelEncoding(raw=True)))
    assert [p.modality for p in prompt.prepared.parts] == ["video", "image"]
    assert prompt.item_counts() == {"video": 2, "image": 1}
    videos = prompt.prepared.parts[0]
    assert videos.hashes[0] == videos.hashes[1]  # the same bytes, the same settings
    assert videos.processed.tensors["video_grid_thw"].shape == (2, 3)


def test_videos_wait_for_a_slot_and_images_do_not(builder, tmp_path, monkeypatch):
    from multimodal.pipeline import PixelEncoding

    prompts = builder(max_concurrent_videos=1)
    running, most = 0, 0
    real = prompts._decode_and_prepare

    def counted(*args):
        nonlocal running, most
        running += 1
        most = max(most, running)
        try:
            import time

            time.sleep(0.2)
            return real(*args)
        finally:
            running -= 1

    monkeypatch.setattr(prompts, "_decode_and_prepare", counted)
    clip = _Request(video(f"data:video/mp4;base64,{b64(mp4(tmp_path))}"))
    still = _Request(image(f"data:image/png;base64,{b64(png())}"))

    async def both(first, second):
        encoding = PixelEncoding(raw=True)
        await asyncio.gather(prompts.build(first, encoding), prompts.build(second, encoding))

    asyncio.run(both(clip, clip))
    assert most == 1
    most = 0
    asyncio.run(both(clip, still))
    assert most == 2


def test_a_bad_video_the_gateway_decodes_is_named(builder, tmp_path):
    from multimodal.pipeline import PixelEncoding

    good = f"data:video/mp4;base64,{b64(mp4(tmp_path))}"
    bad = f"data:video/mp4;base64,{b64(b'nothing' * 10)}"
    request = _Request(video(good), video(bad))
    with pytest.raises(MediaError) as info:
        asyncio.run(builder().build(request, PixelEncoding(raw=True)))
    assert info.value.message.startswith("invalid video: video 1: not a supported video")


def test_media_past_the_message_limit_are_a_400_naming_the_size(builder, tmp_path):
    from gateway.errors import GatewayError
    from multimodal.pipeline import PixelEncoding

    request = _Request(video(f"data:video/mp4;base64,{b64(mp4(tmp_path))}"))
    prompt = asyncio.run(builder().build(request, PixelEncoding(raw=True)))
    size = sum(len(p) for p in prompt.request_fields)
    asyncio.run(builder(max_message_bytes=size).build(request, PixelEncoding(raw=True)))
    with pytest.raises(GatewayError, match="above the 0 MiB a worker message may carry"):
        asyncio.run(builder(max_message_bytes=size - 1).build(request, PixelEncoding(raw=True)))


@pytest.mark.parametrize(
    ("given", "sampling"),
    [
        (None, {}),
        ({"video": {"fps": 1}}, {"fps": 1.0}),
        ({"video": {"fps": 2.5, "num_frames": 8}}, {"fps": 2.5, "num_frames": 8}),
        ({"video": {"num_frames": 4.0}}, {"num_frames": 4}),
    ],
)
def test_media_io_kwargs_are_the_video_sampling(given, sampling):
    from gateway.render.video_options import video_sampling
    from multimodal.processors.base import VideoSampling

    assert video_sampling(given) == VideoSampling(**sampling)


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"video": {"fps": -1}}, "fps must be a positive number"),
        ({"video": {"fps": True}}, "fps must be a positive number"),
        ({"video": {"num_frames": 2.5}}, "num_frames must be an integer"),
        ({"video": {"max_duration": 5}}, "video.max_duration is not supported"),
        ({"video": [1]}, "media_io_kwargs.video must be an object"),
        ({"audio": {}}, "media_io_kwargs.audio: only video loader options"),
    ],
)
def test_media_io_kwargs_the_gateway_does_not_reproduce_are_a_400(given, says):
    from gateway.errors import GatewayError
    from gateway.render.video_options import video_sampling

    with pytest.raises(GatewayError, match=says) as refused:
        video_sampling(given)
    assert refused.value.status == 400 and refused.value.param == "media_io_kwargs"


def test_media_io_kwargs_need_trust_and_cannot_reach_a_worker_that_preprocesses(builder, tmp_path):
    from gateway.errors import GatewayError

    request = _Request(video(f"data:video/mp4;base64,{b64(mp4(tmp_path))}"))
    request.media_io_kwargs = {"video": {"fps": 1}}
    with pytest.raises(GatewayError, match="--trust-request-mm-kwargs"):
        builder().render(request)
    trusted = builder(trust_request_mm_kwargs=True, mm_processing="worker")
    rendered = trusted.render(request)
    with pytest.raises(GatewayError, match=r"set them on the worker \(--media-io-kwargs\)"):
        asyncio.run(trusted.refer(request, rendered))
