"""From decoded items and a prompt with one anchor per item to the wire's MultimodalInputs.

Per modality: resolve the request's options, process the items, hash each (bytes and every
setting that changes its tensors); then expand every anchor at once (`multimodal.prompt`).
Each modality becomes one MultimodalInputs on the wire: the first in `mm_inputs`, any others
in `extra_mm_inputs`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from multimodal.audio import load_audio
from multimodal.audio_decode import DecodedAudio
from multimodal.errors import MediaError
from multimodal.hashing import item_hash, settings_fingerprint
from multimodal.media import MediaPolicy, decode_sources, pending_sources, source_bytes
from multimodal.media_cache import MediaCache
from multimodal.processors.base import (
    ItemProcessor,
    Modality,
    ProcessedItems,
    VideoProcessor,
    VideoSampling,
)
from multimodal.processors.items import ItemShare, split_items
from multimodal.processors.options import first_set
from multimodal.prompt import Placeholders, Range, expand
from multimodal.video import (
    FRAME_LIST_FRAMES,
    FrameListSampling,
    FramePicker,
    LoadedVideo,
    VideoSource,
    read_video,
)
from multimodal.wire import (
    FLOAT_DTYPES,
    Field,
    Node,
    Piece,
    field_number,
    flatten,
    multimodal_inputs,
    multimodal_nodes,
)
from protos import vllm_engine_pb2 as pb

NO_SAMPLING = VideoSampling()
_MM_INPUTS = field_number(pb.GenerateRequest, "mm_inputs")
_EXTRA_MM_INPUTS = field_number(pb.GenerateRequest, "extra_mm_inputs")


class LoadedItem(Protocol):
    """A decoded media item (multimodal.media.LoadedImage, multimodal.video.LoadedVideo,
    `AudioItem`)."""

    @property
    def data(self) -> bytes: ...  # the bytes it came from: the input of its hash

    @property
    def pixels(self) -> Any: ...  # what its processor takes


def decode_items(
    processor: ItemProcessor,
    sources: Sequence[str],
    downloaded: Sequence[bytes | None],
    settings: Any,
    policy: MediaPolicy,
    sampling: VideoSampling = NO_SAMPLING,
    lazy: bool = False,
) -> list[LoadedItem]:
    """Blocking: one modality's sources decoded for `processor` (`downloaded`: the bytes of
    http(s) sources, None for the others): images as vLLM decodes them, videos with the
    frames the family's loader picks under `settings` (from `processor.resolve`) and the
    request's `sampling`. A failure carries the item's index among them. `lazy`: only read
    (and checked as far as that goes) now, decoded when their pixels are first asked for, so
    that `prepare` never decodes an item the media cache holds."""
    if processor.modality == "audio":
        return _audio_items(sources, downloaded, policy, lazy)
    if not isinstance(processor, VideoProcessor):
        if lazy:
            return list(pending_sources(sources, downloaded, policy))
        return list(decode_sources(sources, downloaded, policy))
    videos: list[LoadedItem] = []
    pick = _picker(processor, settings, sampling)
    frame_list = FrameListSampling(
        first_set(sampling.num_frames, FRAME_LIST_FRAMES), first_set(sampling.fps, 1.0)
    )
    for index, (source, raw) in enumerate(zip(sources, downloaded, strict=True)):
        try:
            video = read_video(source, raw, policy)
            if lazy:
                videos.append(PendingVideo(video, pick, frame_list, index))
            else:
                videos.append(video.load(pick, frame_list))
        except MediaError as error:
            error.index, error.kind = index, "video"
            raise
    return videos


class PendingVideo:
    """A video read but not decoded (`decode_items(lazy=True)`): decoded on first use of its
    pixels, a failure then carrying its index as `decode_items`' do."""

    def __init__(
        self, source: VideoSource, pick: FramePicker, frame_list: FrameListSampling, index: int
    ) -> None:
        self.source, self._pick, self._frame_list, self._index = source, pick, frame_list, index
        self._loaded: LoadedVideo | None = None

    @property
    def data(self) -> bytes:
        return self.source.data

    @property
    def loaded(self) -> LoadedVideo:
        if self._loaded is None:
            try:
                self._loaded = self.source.load(self._pick, self._frame_list)
            except MediaError as error:
                error.index, error.kind = self._index, "video"
                raise
        return self._loaded

    @property
    def pixels(self) -> Any:
        return self.loaded.pixels


class AudioItem:
    """An audio clip: its bytes (the input of its hash) and, as its `pixels`, the samples its
    family processes (`DecodedAudio`, at the clip's own rate). Lazy (`decode_items(lazy=True)`):
    the bytes read now, the clip checked and decoded on first use of its samples, a failure
    then carrying its index as `decode_items`' do."""

    def __init__(
        self,
        source: str,
        data: bytes,
        policy: MediaPolicy,
        index: int,
        decoded: DecodedAudio | None = None,
    ) -> None:
        self.data, self._source, self._policy, self._index = data, source, policy, index
        self._decoded = decoded

    @property
    def pixels(self) -> DecodedAudio:
        if self._decoded is None:
            try:  # the bytes are passed as downloaded: read once, checked as they were read
                self._decoded = load_audio(self._source, self.data, self._policy).audio
            except MediaError as error:
                error.index, error.kind = self._index, "audio"
                raise
        return self._decoded


def _audio_items(
    sources: Sequence[str], downloaded: Sequence[bytes | None], policy: MediaPolicy, lazy: bool
) -> list[LoadedItem]:
    items: list[LoadedItem] = []
    for index, (source, raw) in enumerate(zip(sources, downloaded, strict=True)):
        try:
            if lazy:
                data, _ = source_bytes(source, raw, policy.for_audio())
                items.append(AudioItem(source, data, policy, index))
            else:
                loaded = load_audio(source, raw, policy)
                items.append(AudioItem(source, loaded.data, policy, index, loaded.audio))
        except MediaError as error:
            error.index, error.kind = index, "audio"
            raise
    return items


def _picker(processor: VideoProcessor, settings: Any, sampling: VideoSampling):
    return lambda total, fps: processor.pick_frames(total, fps, settings, sampling)


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
class PreparedItems:
    """One modality's items, ready for the wire."""

    modality: Modality
    processed: ProcessedItems
    ranges: list[Range]
    hashes: list[str]


@dataclass
class Prepared:
    prompt_ids: list[int]
    parts: list[PreparedItems]  # one per modality, in the order of the request's items
    float_dtype: str | None  # what floating tensors are cast to on the wire (None: as they are)

    @functools.cached_property
    def mm_inputs(self) -> list[pb.MultimodalInputs]:
        """The wire's MultimodalInputs messages (copies every tensor into them)."""
        return [
            multimodal_inputs(p.processed, p.ranges, p.hashes, self.float_dtype, p.modality)
            for p in self.parts
        ]

    def request_fields(self) -> list[Piece]:
        """The GenerateRequest fields that carry the items, serialized, in pieces that view the
        tensors instead of copying them (appended to the request's own serialized fields)."""
        return flatten(self.request_nodes())

    def request_nodes(self, tensors: Sequence[ProcessedItems] | None = None) -> list[Node]:
        """`request_fields` before `flatten`: each attempt at a worker flattens them with its
        own tensor transport (fresh /dev/shm segments, or inline). `tensors`: per part, the
        batch whose tensors are sent instead of the part's own (some items left out, for a
        worker that holds them: gateway/workers/send_once.py)."""
        batches = tensors if tensors is not None else [p.processed for p in self.parts]
        return [
            Field(number, multimodal_nodes(b, p.ranges, p.hashes, self.float_dtype, p.modality))
            for number, p, b in zip(self._field_numbers(), self.parts, batches)
        ]

    def _field_numbers(self) -> list[int]:
        return [_MM_INPUTS] + [_EXTRA_MM_INPUTS] * (len(self.parts) - 1)


def prepare(
    groups: Sequence[tuple[ItemProcessor, Sequence[LoadedItem]]],
    prompt_ids: Sequence[int],
    kwargs: Mapping[str, Any],
    encoding: PixelEncoding,
    sampling: VideoSampling = NO_SAMPLING,
    cache: MediaCache | None = None,
) -> Prepared:
    """`groups`: each modality's processor and its items in prompt order; `sampling`: the
    request's video loader options the videos were decoded with (`decode_items`); `cache`:
    items processed before, by hash (None: every item processed here). An item the cache
    holds is neither processed nor (a `multimodal.media.PendingImage`) decoded. CPU-bound:
    callers on an event loop run it in a worker thread."""
    parts, placeholders = [], []
    for processor, items in groups:
        settings = processor.resolve(kwargs)
        # The key is known before processing: the settings, not their output, go into it.
        fingerprint = item_fingerprint(processor, settings, encoding, sampling)
        hashes = [item_hash(i.data, fingerprint) for i in items]
        if cache is None:
            processed = processor.process([i.pixels for i in items], settings, encoding.raw)
        else:
            processed = _through_cache(processor, items, hashes, settings, encoding, cache)
        parts.append(PreparedItems(processor.modality, processed, [], hashes))
        placeholders.append(
            Placeholders(processor.modality, processor.anchor_token_id, processed.replacements)
        )
    ids, ranges = expand(prompt_ids, placeholders)
    for processor, _ in groups:
        ids, ranges = processor.finish_prompt(ids, ranges)
    for part, part_ranges in zip(parts, ranges):
        part.ranges = part_ranges
    return Prepared(ids, parts, None if encoding.raw else encoding.float_dtype)


def item_fingerprint(
    processor: ItemProcessor,
    settings: Any,
    encoding: PixelEncoding,
    sampling: VideoSampling = NO_SAMPLING,
) -> bytes:
    """What besides its bytes makes an item's tensors: the family, the resolved settings (from
    `processor.resolve`), a video's sampling and the pixel encoding."""
    options = dataclasses.asdict(settings)
    if isinstance(processor, VideoProcessor) and sampling != NO_SAMPLING:
        options["media_io"] = dataclasses.asdict(sampling)  # other frames, other tensors
    return settings_fingerprint(processor.family, options, encoding.name)


def _through_cache(
    processor: ItemProcessor,
    items: Sequence[LoadedItem],
    hashes: Sequence[str],
    settings: Any,
    encoding: PixelEncoding,
    cache: MediaCache,
) -> ProcessedItems:
    """The items' batch from cached shares and, for the others, shares of each processed
    alone (a share of a batch may carry the batch's padding), which the cache then keeps."""
    shares: list[ItemShare] = []
    fresh: dict[str, ItemShare] = {}  # an item repeated within the request: processed once
    for index, (item, key) in enumerate(zip(items, hashes)):
        share = fresh.get(key) or cache.get(key)
        if share is None:
            try:
                processed = processor.process([item.pixels], settings, encoding.raw)
            except MediaError as error:  # (a clip too short for one audio token)
                if error.index is not None:
                    error.index = index  # its place among the request's, not in a batch of 1
                raise
            share = fresh[key] = split_items(processed, copy=False)[0]  # all of a batch of 1
            cache.put(key, share)
        shares.append(share)
    return processor.join(shares)
