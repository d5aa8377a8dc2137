"""POST /v1/preprocess: what the gateway makes of each image of a chat request, without
generating anything.

It takes what /v1/chat/completions takes to build a prompt (`messages`, `mm_processor_kwargs`,
`chat_template_kwargs`, ...) and runs the same path (render, fetch, decode, preprocess, expand)
for the pixel encoding the workers take; per image it answers with the processor family, the
decoded size, the grid or tile counts, the placeholder tokens it takes in the prompt and the
tensors sent for it (`mmgate preprocess` shows the same from the command line). It answers as
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
)
from gateway.errors import GatewayError, check_model, parse_body
from gateway.render.prompt import Prompt, PromptBuilder
from gateway.workers.worker import WorkerFacts
from multimodal.item_facts import item_grid, item_tensors, placeholder_counts
from multimodal.media import LoadedImage
from protos import vllm_engine_pb2 as pb


class PreprocessService:
    def __init__(self, model_name: str, prompts: PromptBuilder, facts: WorkerFacts) -> None:
        """`facts`: the model's worker facts (the pixel encoding the workers take)."""
        self.model_name, self.prompts, self.facts = model_name, prompts, facts
        self.processor = prompts.processors.by_modality.get("image")

    async def preprocess(self, body: Any) -> dict:
        request = parse_body(PreprocessRequest, body)
        check_model(request.model, self.model_name)
        rendered = self.prompts.render(request)
        processed_by: Literal["gateway", "worker"] | None = None
        images: list[ImageFacts] = []
        ids = rendered.token_ids
        if rendered.media:
            if self.prompts.by_worker(rendered):
                processed_by, prompt = "worker", await self.prompts.refer(request, rendered)
                images = [_referred(i, ref) for i, ref in enumerate(prompt.media_refs.items)]
            else:
                processed_by = "gateway"
                prompt = await self.prompts.expand(
                    request, self.facts.pixels, rendered, keep_items=True
                )
                images = _preprocessed(prompt)
            check_items(prompt, self.facts)
            ids = prompt.ids
        processor = self.processor if processed_by != "worker" else None
        return PreprocessResponse(
            model=self.model_name,
            processed_by=processed_by,
            family=processor.family if processor else None,
            family_title=processor.title if processor else None,
            pixels=self.facts.pixels.name if processor else None,
            prompt_tokens=len(ids),
            images=images,
        ).model_dump()


def _preprocessed(prompt: Prompt) -> list[ImageFacts]:
    if prompt.prepared is None:  # a prompt with media always has them; for the type checker
        raise GatewayError("the images were not preprocessed", 500)
    (part,) = prompt.prepared.parts  # images are the only modality the renderer emits
    wire_float = prompt.prepared.float_dtype
    facts = []
    for index, (item, placeholder) in enumerate(zip(prompt.items, part.ranges)):
        shares = item_tensors(part.processed, index)
        width, height = _size(item)
        tokens, embeddings = placeholder_counts(
            prompt.ids, placeholder, part.processed.embed_token_id
        )
        facts.append(
            ImageFacts(
                index=index,
                bytes=len(item.data),
                mime=item.mime,
                width=width,
                height=height,
                placeholder=PlaceholderFacts(offset=placeholder[0], length=placeholder[1]),
                tokens=tokens,
                embeddings=embeddings,
                grid=item_grid(part.processed, shares),
                tensors={name: _tensor(share, wire_float) for name, share in shares.items()},
                hash=part.hashes[index],
            )
        )
    return facts


def _size(item: LoadedImage) -> tuple[int, int]:
    height, width = item.pixels.shape[:2]
    return int(width), int(height)


def _tensor(share: np.ndarray, wire_float: str | None) -> TensorFacts:
    # Floating tensors travel cast to the engine's encoder dtype (multimodal.wire).
    floating = np.issubdtype(share.dtype, np.floating)
    dtype = wire_float if floating and wire_float else str(share.dtype)
    return TensorFacts(shape=list(share.shape), dtype=dtype)


def _referred(index: int, ref: pb.MediaRef) -> ImageFacts:
    """An image a worker preprocesses: the gateway has checked its bytes, which travel as a
    data: URL; what the worker makes of them is the worker's to know."""
    head, _, payload = ref.url.partition(",")
    mime = head.removeprefix("data:").removesuffix(";base64") or None
    # (a video/jpeg frame list holds its frames' base64 apart by commas)
    size = sum(len(pybase64.b64decode(part)) for part in payload.split(","))
    return ImageFacts(index=index, bytes=size, mime=mime)
