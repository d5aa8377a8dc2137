"""The gateway's own video path, run in-process: what the video families' tests hold against
`tests.support.vllm_video.vllm_video_inputs`.

`gateway_video_inputs` renders the same chat (one user message: the videos' parts, then the
text) with the gateway's renderer, loads every clip with the frames the model's video family
picks (`multimodal.pipeline.decode_items`, i.e. `multimodal.video.load_video`) and prepares
the prompt and tensors (`multimodal.pipeline.prepare`), as the gateway's PromptBuilder does.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def video_messages(videos: Sequence[str], text: str = "Describe.") -> list[dict[str, Any]]:
    parts = [{"type": "video_url", "video_url": {"url": url}} for url in videos]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


def gateway_video_inputs(
    model: Path, videos: Sequence[str], raw_pixels: bool, media_io: dict | None = None
) -> Any:
    """The `multimodal.pipeline.Prepared` of a chat with these videos (data: URIs), pixels
    raw (uint8) or normalized (float32) as `raw_pixels` says, sampled as a request's
    `media_io_kwargs["video"]` (`media_io`) asks."""
    from gateway.render.model_files import ModelFiles
    from gateway.render.renderer import ChatRenderer
    from multimodal.pipeline import PixelEncoding, decode_items, prepare
    from multimodal.policy import MediaPolicy
    from multimodal.processors.base import VideoSampling
    from multimodal.registry import processors_for

    files = ModelFiles.load(model)
    processors = processors_for(files)
    rendered = ChatRenderer(files, processors.placeholders).render(video_messages(videos))
    processor = processors.get("video")
    settings = processor.resolve({})
    sampling = VideoSampling(**(media_io or {}))
    blank = [None] * len(videos)
    loaded = decode_items(processor, videos, blank, settings, MediaPolicy(), sampling)
    encoding = PixelEncoding(raw=raw_pixels)
    return prepare([(processor, loaded)], rendered.token_ids, {}, encoding, sampling)
