"""POST /v1/preprocess: what the gateway makes of each image and video of a chat request,
without generating anything.

It takes what /v1/chat/completions takes to build a prompt (`messages`, `mm_processor_kwargs`,
`chat_template_kwargs`, ...) and runs the same path (render, fetch, decode, preprocess, expand)
for the pixel encoding the workers take; per image it answers with the processor family, the
decoded size, the grid or tile counts, the placeholder tokens it takes in the prompt and the
tensors sent for it, and per video the same plus the frames its loader picked and their times
(`mmgate preprocess` shows the same from the command line). It answers as
chat would refuse: a bad image is the same 400 naming the image. The playground calls it for
every image attached. Under /v1, so `--api-key` guards it as it guards chat.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import pybase64

from gateway.api.chat import check_items
from gateway.api.protocol import (
    ImageFacts,
    PlaceholderFacts,
    PreprocessRequest,
    PreprocessResponse,
    TensorFacts,
    VideoFacts,
)
from gateway.errors import GatewayError, check_model, parse_body
from gateway.render.prompt import Prompt, PromptBuilder
from gateway.workers.worker import WorkerFacts
from multimodal.item_facts import item_grid, item_tensors, placeholder_counts
from multimodal.media import LoadedImage
from multimodal.pipeline import LoadedItem, PreparedItems
from multimodal.video import LoadedVideo
from protos import common_pb2
from protos import vllm_engine_pb2 as pb


class PreprocessService:
    def __init__(self, model_name: str, prompts: PromptBuilder, facts: WorkerFacts) -> None:
        """`facts`: the model's worker facts (the pixel encoding the workers take)."""
        self.model_name, self.prompts, self.facts = model_name, prompts, facts
        self.processor = prompts.processors.by_modality.get("image")
        self.video_processor = prompts.processors.by_modality.get("video")

    async def preprocess(self, body: Any) -> dict:
        request = parse_body(PreprocessRequest, body)
        check_model(request.model, self.model_name)
        rendered = self.prompts.render(request)
        processed_by: Literal["gateway", "worker"] | None = None
        facts: dict[str, list] = {"image": [], "video": []}
        ids = rendered.token_ids
        if rendered.media:
            if self.prompts.by_worker(rendered):
                processed_by, prompt = "worker", await self.prompts.refer(request, rendered)
                facts = _referred_all(prompt.media_refs.items)
            else:
                processed_by = "gateway"
                prompt = await self.prompts.expand(
                    request, self.facts.pixels, rendered, keep_items=True
                )
                facts = _preprocessed(prompt)
            check_items(prompt, self.facts)
            ids = prompt.ids
        here = processed_by != "worker"
        processor = self.processor if here else None
        video_processor = self.video_processor if here else None
        return PreprocessResponse(
            model=self.model_name,
            processed_by=processed_by,
            family=processor.family if processor else None,
            family_title=processor.title if processor else None,
            pixels=self.facts.pixels.name if processor or video_processor else None,
            prompt_tokens=len(ids),
            images=facts["image"],
            videos=facts["video"],
            video_family=video_processor.family if video_processor else None,
        ).model_dump()


def _preprocessed(prompt: Prompt) -> dict[str, list]:
    """Each modality's item facts; `prompt.items` holds the parts' items one part after
    another."""
    if prompt.prepared is None:  # a prompt with media always has them; for the type checker
        raise GatewayError("the media were not preprocessed", 500)
    facts: dict[str, list] = {"image": [], "video": []}
    start = 0
    for part in prompt.prepared.parts:
        items = prompt.items[start : start + len(part.ranges)]
        start += len(part.ranges)
        facts[part.modality] = [
            _item_facts(prompt, part, index, item) for index, item in enumerate(items)
        ]
    return facts


def _item_facts(
    prompt: Prompt, part: PreparedItems, index: int, item: LoadedItem
) -> ImageFacts | VideoFacts:
    shares = item_tensors(part.processed, index)
    placeholder = part.ranges[index]
    tokens, embeddings = placeholder_counts(prompt.ids, placeholder, part.processed.embed_token_id)
    wire_float = prompt.prepared.float_dtype if prompt.prepared else None
    common = {
        "index": index,
        "bytes": len(item.data),
        "placeholder": PlaceholderFacts(offset=placeholder[0], length=placeholder[1]),
        "tokens": tokens,
        "embeddings": embeddings,
        "grid": item_grid(part.processed, shares),
        "tensors": {name: _tensor(share, wire_float) for name, share in shares.items()},
        "hash": part.hashes[index],
    }
    if isinstance(item, LoadedVideo):
        return _video_facts(item, common)
    assert isinstance(item, LoadedImage)
    height, width = item.pixels.shape[:2]
    return ImageFacts(**common, mime=item.mime, width=int(width), height=int(height))


def _video_facts(item: LoadedVideo, common: dict[str, Any]) -> VideoFacts:
    clip = item.clip
    fps = float(clip.fps)
    return VideoFacts(
        **common,
        mime=item.mime,
        width=int(clip.frames.shape[2]),
        height=int(clip.frames.shape[1]),
        total_frames=clip.total_frames,
        fps=fps,
        frames=list(clip.indices),
        seconds=[round(i / fps, 3) if fps > 0 else 0.0 for i in clip.indices],
    )


def _tensor(share: np.ndarray, wire_float: str | None) -> TensorFacts:
    # Floating tensors travel cast to the engine's encoder dtype (multimodal.wire).
    floating = np.issubdtype(share.dtype, np.floating)
    dtype = wire_float if floating and wire_float else str(share.dtype)
    return TensorFacts(shape=list(share.shape), dtype=dtype)


def _referred_all(refs: Any) -> dict[str, list]:
    facts: dict[str, list] = {"image": [], "video": []}
    for ref in refs:
        modality = "video" if ref.modality == common_pb2.VIDEO else "image"
        facts[modality].append(_referred(len(facts[modality]), ref, modality))
    return facts


def _referred(index: int, ref: pb.MediaRef, modality: str) -> ImageFacts:
    """An image a worker preprocesses: the gateway has checked its bytes, which travel as a
    data: URL; what the worker makes of them is the worker's to know."""
    head, _, payload = ref.url.partition(",")
    mime = head.removeprefix("data:").removesuffix(";base64") or None
    # (a video/jpeg frame list holds its frames' base64 apart by commas)
    size = sum(len(pybase64.b64decode(part)) for part in payload.split(","))
    kind = VideoFacts if modality == "video" else ImageFacts
    return kind(index=index, bytes=size, mime=mime)
