"""From decoded images and a prompt with one anchor per image to the wire's MultimodalInputs."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from multimodal.hashing import item_hash, settings_fingerprint
from multimodal.media import LoadedImage
from multimodal.processors.base import ImageProcessor, ProcessedImages
from multimodal.prompt import expand
from multimodal.wire import FLOAT_DTYPES, Piece, encode_multimodal_inputs, multimodal_inputs
from protos import vllm_engine_pb2 as pb


@dataclass(frozen=True)
class PixelEncoding:
    """What the engine takes (GetServerInfo): raw uint8, or normalized floats of a dtype."""

    raw: bool
    float_dtype: str = "float32"

    @classmethod
    def for_engine(cls, device_normalizes: bool, encoder_dtype: str) -> PixelEncoding:
        dtype = encoder_dtype if encoder_dtype in FLOAT_DTYPES else "float32"
        return cls(raw=device_normalizes, float_dtype=dtype)

    @property
    def name(self) -> str:
        return "uint8" if self.raw else self.float_dtype


@dataclass
class Prepared:
    prompt_ids: list[int]
    processed: ProcessedImages
    ranges: list[tuple[int, int]]
    hashes: list[str]
    float_dtype: str | None  # what floating tensors are cast to on the wire (None: as they are)

    @functools.cached_property
    def mm_inputs(self) -> pb.MultimodalInputs:
        """The wire's MultimodalInputs message (copies every tensor into it)."""
        return multimodal_inputs(self.processed, self.ranges, self.hashes, self.float_dtype)

    def encoded_mm_inputs(self) -> list[Piece]:
        """`mm_inputs` serialized, in pieces that view the tensors instead of copying them."""
        return encode_multimodal_inputs(self.processed, self.ranges, self.hashes, self.float_dtype)


def prepare(
    processor: ImageProcessor,
    prompt_ids: Sequence[int],
    images: Sequence[LoadedImage],
    options: Mapping[str, Any],
    encoding: PixelEncoding,
) -> Prepared:
    """CPU-bound: callers on an event loop run it in a worker thread."""
    resolved = processor.resolve_options(options)
    processed = processor.process([i.pixels for i in images], resolved, encoding.raw)
    ids, ranges = expand(prompt_ids, processor.anchor_token_id, processed.replacements)
    fingerprint = settings_fingerprint(processor.family, resolved, encoding.name)
    hashes = [item_hash(i.data, fingerprint) for i in images]
    float_dtype = None if encoding.raw else encoding.float_dtype
    return Prepared(ids, processed, ranges, hashes, float_dtype)
