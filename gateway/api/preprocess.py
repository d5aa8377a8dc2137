"""POST /v1/preprocess: what the gateway makes of each image, video and audio clip of a chat
request, without generating anything.

It takes what /v1/chat/completions takes to build a prompt (`messages`, `mm_processor_kwargs`,
`chat_template_kwargs`, ...) and runs the same path (render, fetch, decode, preprocess, expand)
for the pixel encoding the workers take; per image it answers with the processor family, the
decoded size, the grid or tile counts, the placeholder tokens it takes in the prompt and the
tensors sent for it, and per video the same plus the frames its loader picked and their times
(`mmgate preprocess` shows the same from the command line); per audio clip its container,
sample rate, channels and length as decoded, whoever preprocesses it (the gateway decodes every
clip to check it), and the same tensor facts when the gateway preprocesses it. It names the
media the model takes (`modalities`), which the playground offers to attach. It answers as
chat would refuse: a bad image is the same 400 naming the image. The playground calls it for
every image attached. Under /v1, so `--api-key` guards it as it guards chat.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import pybase64

from gateway.api.chat import check_items
from gateway.api.protocol import (
    AudioFacts,
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
from multimodal.audio import load_audio, probe_audio, sniff_audio
from multimodal.audio_decode import DecodedAudio
from multimodal.item_facts import item_grid, item_tensors, placeholder_counts
from multimodal.media import LoadedImage, MediaPolicy
from multimodal.pipeline import AudioItem, LoadedItem, PreparedItems
from multimodal.placeholders import known_modalities
from multimodal.video import LoadedVideo
from protos import common_pb2
from protos import vllm_engine_pb2 as pb


class PreprocessService:
    def __init__(self, model_name: str, prompts: PromptBuilder, facts: WorkerFacts) -> None:
        """`facts`: the model's worker facts (the pixel encoding the workers take)."""
        self.model_name, self.prompts, self.facts = model_name, prompts, facts
        by_modality = prompts.processors.by_modality
        self.processor = by_modality.get("image")
        self.video_processor = by_modality.get("video")
        self.audio_processor = by_modality.get("audio")
        architectures = prompts.renderer.files.config.get("architectures") or ()
        self.modalities = (
            offered_modalities(prompts.renderer.placeholders, by_modality, architectures)
            if facts.supports_vision
            else []
        )

    async def preprocess(self, body: Any) -> dict:
        request = parse_body(PreprocessRequest, body)
        check_model(request.model, self.model_name)
        rendered = self.prompts.render(request)
        processed_by: Literal["gateway", "worker"] | None = None
        facts: dict[str, list] = _no_facts()
        ids = rendered.token_ids
        if rendered.media:
            # (as chat decides it for a pool of workers like the one whose facts these are)
            if self.prompts.by_worker(rendered, self.facts.takes_audio_mm_inputs):
                processed_by, prompt = "worker", await self.prompts.refer(request, rendered)
                policy = self.prompts.media_policy
                facts = await asyncio.to_thread(referred_facts, prompt.media_refs.items, policy)
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
        audio_processor = self.audio_processor if here else None
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
            audio=facts["audio"],
            audio_family=audio_processor.family if audio_processor else None,
            modalities=self.modalities,
        ).model_dump()


MODALITIES: tuple[str, ...] = ("image", "video", "audio")


def offered_modalities(
    placeholders: Mapping[str, Any], processed_here: Mapping[str, Any], architectures: Sequence[str]
) -> list[str]:
    """The media a model takes through the gateway: those the renderer has a placeholder for,
    preprocessed here or else of a kind vLLM's model class writes placeholder text for (the
    fallback renders an image part for any architecture, which a Qwen2-Audio does not take);
    images for an architecture vLLM's table does not know."""
    known = known_modalities(architectures) or {"image"}
    return [m for m in MODALITIES if m in placeholders and (m in processed_here or m in known)]


def _no_facts() -> dict[str, list]:
    return {modality: [] for modality in MODALITIES}


def _preprocessed(prompt: Prompt) -> dict[str, list]:
    """Each modality's item facts; `prompt.items` holds the parts' items one part after
    another."""
    if prompt.prepared is None:  # a prompt with media always has them; for the type checker
        raise GatewayError("the media were not preprocessed", 500)
    facts = _no_facts()
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
) -> ImageFacts | VideoFacts | AudioFacts:
    """The item's facts from whatever tensors its processor made (an image's pixel_values, an
    audio clip's input_features, ...), and what its kind adds."""
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
    if isinstance(item, AudioItem):
        return AudioFacts(**common, **audio_facts(item.data, item.pixels))
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


def referred_facts(refs: Any, policy: MediaPolicy) -> dict[str, list]:
    """Blocking (an audio clip is decoded): the facts of media a worker preprocesses."""
    facts = _no_facts()
    for ref in refs:
        modality = _REF_MODALITIES.get(ref.modality, "image")
        facts[modality].append(_referred(len(facts[modality]), ref, modality, policy))
    return facts


_REF_MODALITIES = {common_pb2.VIDEO: "video", common_pb2.AUDIO: "audio"}


def _referred(
    index: int, ref: pb.MediaRef, modality: str, policy: MediaPolicy
) -> ImageFacts | AudioFacts:
    """An item a worker preprocesses: the gateway has checked its bytes, which travel as a
    data: URL; what the worker makes of them is the worker's to know. An audio clip's own
    facts are the gateway's too: it decoded the clip to check it (and does again here, from
    the very bytes the worker gets, under the same policy)."""
    head, _, payload = ref.url.partition(",")
    mime = head.removeprefix("data:").removesuffix(";base64") or None
    if modality == "audio":
        loaded = load_audio(ref.url, None, policy)
        return AudioFacts(
            index=index, bytes=len(loaded.data), **audio_facts(loaded.data, loaded.audio)
        )
    # (a video/jpeg frame list holds its frames' base64 apart by commas)
    size = sum(len(pybase64.b64decode(part)) for part in payload.split(","))
    kind = VideoFacts if modality == "video" else ImageFacts
    return kind(index=index, bytes=size, mime=mime)


def audio_facts(data: bytes, decoded: DecodedAudio) -> dict[str, Any]:
    """A checked clip's container (sniffed from its bytes, as the check did), rate, channels
    (its header's: a packed integer decode by FFmpeg comes as one interleaved row,
    `multimodal.audio_decode`) and length, from its bytes and their decoded samples."""
    mime, channels = sniff_audio(data) or "audio/unknown", probe_audio(data).channels
    return {
        "mime": mime,
        "format": mime.removeprefix("audio/"),
        "sample_rate": decoded.sample_rate,
        "channels": channels,
        "seconds": round(decoded.samples.size / channels / decoded.sample_rate, 3),
    }
