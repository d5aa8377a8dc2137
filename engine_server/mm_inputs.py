"""Preprocessed `MultimodalInputs` from the wire to a vLLM multimodal prompt, HF processor bypassed.

The gateway (or SMG) already expanded the placeholders and computed every tensor; this module only
checks that what arrived is self-consistent and lays it out the way vLLM's own processor would
have: one field config per tensor (batched / flat with a sizes tensor / shared; a flat key whose
sizes tensor has a row of extents per item is a padded batch, each item cut back to its own
shape, as vLLM's Pixtral processors hand images over), placeholder ranges with an embedding
mask when they hold structural tokens, and one hash per item.

Flat tensors are cut along their first axis on the wire. A model that concatenates an item's
rows along another axis (Qwen2.5-Omni's audio features, [128 mel bins, frames], flat along the
frames) gets the wire's first axis moved there and its field config on that axis: which axis
is the model's own field config's (`FlatDims`, from vLLM's processor), not the sender's word.

Items a sender left out (`cached`: the worker's item cache, engine_server/mm_item_cache.py)
have a placeholder and a hash but no share of the batch's tensors, which then hold only the
items sent: the batch is laid out for those, and the cached items are put back in place.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import blake3
import torch
from transformers import BatchFeature
from vllm.inputs.engine import MultiModalInput, mm_input
from vllm.multimodal.inputs import (
    MultiModalFieldConfig,
    MultiModalFlatField,
    MultiModalKwargsItem,
    MultiModalKwargsItems,
    PlaceholderRange,
)

from engine_server.errors import InvalidRequest
from engine_server.tensors import tensor_from_proto
from protos import common_pb2

PRIMARY_KEY = "pixel_values"


@dataclass(frozen=True)
class PixelContract:
    """What the engine expects of encoder pixels; reported to clients by GetServerInfo."""

    device_normalizes: bool  # vLLM's mm_device_do_normalize: raw uint8 in, normalized on device
    model_dtype: torch.dtype  # float tensors are cast to it, as vLLM's processor output is


@dataclass
class _Batch:
    modality: str
    tensors: dict[str, torch.Tensor]
    fields: dict[str, MultiModalFieldConfig]
    placeholders: list[PlaceholderRange]
    hashes: list[str]
    omitted: list[bool]  # per item: left out of the tensors, taken from the cache


SlotCheck = Callable[[MultiModalKwargsItems, dict[str, list[PlaceholderRange]]], None]
# The wire's modality ("image", "video", "audio") to the one the model keys its items by.
ModalityMap = Callable[[str], str]
# (modality, a batch's tensors by engine key) -> the axis the model concatenates each flat
# tensor's items along, for those where it is not the first (`model_flat_dims`).
FlatDims = Callable[[str, Mapping[str, torch.Tensor]], Mapping[str, int]]
_WIRE_MODALITIES = {
    common_pb2.MODALITY_UNSPECIFIED: "image",
    common_pb2.IMAGE: "image",
    common_pb2.VIDEO: "video",
    common_pb2.AUDIO: "audio",
}


def wire_modality(batch) -> str:
    """The batch's modality as the wire names it ("image" when unset); InvalidRequest for a
    value this server does not know."""
    name = _WIRE_MODALITIES.get(batch.modality)
    if name is None:
        raise InvalidRequest(f"mm_inputs.modality: unknown modality {batch.modality}")
    return name


def model_flat_dims(processor: Any) -> FlatDims:
    """The axes vLLM's processor for the model (`processor`: its BaseMultiModalProcessor; None:
    every flat tensor along its first axis) concatenates flat audio tensors along: its own
    `_get_mm_fields_config` on the batch's tensors. Audio only: image and video tensors are
    flat along their first axis in every model here, and their configs are not asked for."""

    def dims(modality: str, tensors: Mapping[str, torch.Tensor]) -> Mapping[str, int]:
        if processor is None or modality != "audio":
            return {}
        configs = processor._get_mm_fields_config(BatchFeature(dict(tensors)), {})
        return {
            key: config.field.dim
            for key, config in configs.items()
            if key in tensors
            and isinstance(config.field, MultiModalFlatField)
            and config.field.dim != 0
        }

    return dims


def build_mm_prompt(
    prompt_ids: list[int],
    batches: Sequence,
    contract: PixelContract,
    text: str | None = None,
    check_slots: SlotCheck | None = None,
    modality_of: ModalityMap = str,
    cached: Mapping[str, MultiModalKwargsItem] | None = None,
    flat_dims: FlatDims | None = None,
) -> MultiModalInput:
    """`cached`: items by hash that the request left out of its tensors; `flat_dims`: the
    model's axes for flat tensors not cut along their first (None: all are)."""
    ids = torch.tensor(prompt_ids, dtype=torch.int64)
    cached = cached or {}
    decoded = [
        _decode_batch(b, i, ids, contract, modality_of, cached, flat_dims)
        for i, b in enumerate(batches)
    ]
    hf_dict: dict[str, torch.Tensor] = {}
    fields: dict[str, MultiModalFieldConfig] = {}
    for batch in decoded:
        clash = batch.tensors.keys() & hf_dict.keys()
        if clash:
            raise InvalidRequest(
                f"extra_mm_inputs: tensors {sorted(clash)} appear in two batches; "
                "send one batch per modality"
            )
        hf_dict.update(batch.tensors)
        fields.update(batch.fields)
    # Already tensors (no conversion asked): a ragged batch's items are a list of them.
    features = BatchFeature(hf_dict)
    mm_kwargs = MultiModalKwargsItems.from_hf_inputs(features, fields)
    for batch in decoded:
        if any(batch.omitted):
            mm_kwargs[batch.modality] = _with_cached(batch, mm_kwargs.get(batch.modality), cached)
    hashes = {b.modality: b.hashes or _content_hashes(mm_kwargs, b.modality) for b in decoded}
    placeholders = {b.modality: b.placeholders for b in decoded}
    _check_overlaps(placeholders)
    if check_slots is not None:
        check_slots(mm_kwargs, placeholders)
    return mm_input(prompt_ids, mm_kwargs, hashes, placeholders, prompt=text or None)


def _decode_batch(
    batch,
    index: int,
    ids: torch.Tensor,
    contract: PixelContract,
    modality_of: ModalityMap,
    cached: Mapping[str, MultiModalKwargsItem],
    flat_dims: FlatDims | None = None,
) -> _Batch:
    where = "mm_inputs" if index == 0 else f"extra_mm_inputs[{index - 1}]"
    kind = wire_modality(batch)
    modality = modality_of(kind)
    if not batch.mm_placeholders:
        raise InvalidRequest(f"{where}.mm_placeholders: a multimodal batch needs one per item")
    if batch.mm_hashes and len(batch.mm_hashes) != len(batch.mm_placeholders):
        raise InvalidRequest(
            f"{where}.mm_hashes: {len(batch.mm_hashes)} hashes for "
            f"{len(batch.mm_placeholders)} placeholders"
        )
    omitted = [h in cached for h in batch.mm_hashes] or [False] * len(batch.mm_placeholders)
    # The tensors hold the items sent, laid out as a batch of those alone.
    num_items = omitted.count(False)
    if num_items == 0:
        if batch.HasField("pixel_values") or batch.model_specific_tensors:
            raise InvalidRequest(f"{where}: tensors sent for a batch of cached items only")
        return _Batch(
            modality, {}, {}, _placeholders(batch, ids, where), list(batch.mm_hashes), omitted
        )
    if not batch.HasField("pixel_values"):
        raise InvalidRequest(f"{where}.pixel_values: missing (pixel-less batches need remote KV)")
    primary = batch.encoder_input_key if batch.HasField("encoder_input_key") else PRIMARY_KEY
    wire = {primary: tensor_from_proto(batch.pixel_values, f"{where}.pixel_values")}
    for key, td in batch.model_specific_tensors.items():
        if key == primary:
            raise InvalidRequest(f"{where}.model_specific_tensors[{key!r}] repeats pixel_values")
        wire[key] = tensor_from_proto(td, f"{where}.model_specific_tensors[{key!r}]")
    if kind == "audio":
        _check_features(wire[primary], f"{where}.pixel_values")
    else:  # (audio features are floats whatever the engine does with pixels)
        _check_pixels(wire[primary], contract, f"{where}.pixel_values")
    tensors = {_engine_key(k, modality): _to_model_dtype(t, contract) for k, t in wire.items()}
    fields = _field_configs(batch, wire, modality, num_items, where)
    for key, sizes_key in batch.flat_keys.items():
        if key in wire and _is_extents(wire.get(sizes_key)):
            name = _engine_key(key, modality)
            tensors[name] = _unpadded(key, tensors[name], sizes_key, wire, batch, num_items, where)
    dims = flat_dims(modality, tensors) if flat_dims is not None else {}
    for key, dim in dims.items():
        field = fields.get(key)
        if field is not None and isinstance(field.field, MultiModalFlatField):
            fields[key] = _flat_along(field, key, tensors, dim, where)
    return _Batch(
        modality,
        tensors,
        {_engine_key(k, modality): f for k, f in fields.items()},
        _placeholders(batch, ids, where),
        list(batch.mm_hashes),
        omitted,
    )


def _with_cached(
    batch: _Batch,
    sent: Sequence[MultiModalKwargsItem] | None,
    cached: Mapping[str, MultiModalKwargsItem],
) -> list[MultiModalKwargsItem]:
    """The batch's items in prompt order: each sent one decoded, each left-out one cached."""
    fresh = iter(sent or ())
    items = [cached[h] if out else next(fresh) for h, out in zip(batch.hashes, batch.omitted)]
    if next(fresh, None) is not None:
        raise InvalidRequest("mm_inputs: the tensors hold more items than were sent")
    return items


def _engine_key(key: str, modality: str) -> str:
    # vLLM's video encoders read `pixel_values_videos`; grids already carry video names.
    return "pixel_values_videos" if modality == "video" and key == PRIMARY_KEY else key


def _check_pixels(pixels: torch.Tensor, contract: PixelContract, field: str) -> None:
    # The one way to corrupt outputs silently is to normalize twice (or never): refuse it.
    if contract.device_normalizes and pixels.dtype != torch.uint8:
        raise InvalidRequest(
            f"{field}: this engine normalizes pixels on device (mm_device_do_normalize) and "
            f"takes raw uint8 pixels, got {_wire_name(pixels.dtype)}"
        )
    if not contract.device_normalizes and not pixels.is_floating_point():
        raise InvalidRequest(
            f"{field}: this engine takes normalized float pixels (mm_device_do_normalize is off), "
            f"got {_wire_name(pixels.dtype)}"
        )


def _check_features(features: torch.Tensor, field: str) -> None:
    if not features.is_floating_point():
        raise InvalidRequest(
            f"{field}: audio features must be floating point, got {_wire_name(features.dtype)}"
        )


def _flat_along(
    config: MultiModalFieldConfig, key: str, tensors: dict, dim: int, where: str
) -> MultiModalFieldConfig:
    """`tensors[key]` (items' rows along the first axis) with that axis moved to `dim`, where
    the model concatenates its items, and its field config on that axis (the same sizes)."""
    tensor = tensors[key]
    if not 0 < dim < tensor.ndim:
        raise InvalidRequest(
            f"{where}: {key!r} of shape {list(tensor.shape)} has no axis {dim} for the model "
            "to concatenate its items along"
        )
    tensors[key] = tensor.movedim(0, dim).contiguous()
    flat = config.field  # cut along the first axis: one slice (or 1-tuple of one) per item
    cuts = [s[0] if isinstance(s, tuple) else s for s in flat.slices]
    sizes = torch.tensor([s.stop - s.start for s in cuts], dtype=torch.int64)
    return MultiModalFieldConfig.flat_from_sizes(
        config.modality, sizes, dim=dim, keep_on_cpu=flat.keep_on_cpu
    )


def _wire_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _to_model_dtype(tensor: torch.Tensor, contract: PixelContract) -> torch.Tensor:
    # Mirrors vLLM's processor post-processing, skipped when the processor is bypassed.
    return tensor.to(contract.model_dtype) if tensor.is_floating_point() else tensor


def _field_configs(
    batch, wire: dict[str, torch.Tensor], modality: str, num_items: int, where: str
) -> dict[str, MultiModalFieldConfig]:
    # The layout may name tensors this request does not carry: SMG sends its static layout
    # for the model (Qwen3.5's names video_grid_thw in an image-only request), and the
    # upstream servicer reads it only for the tensors sent. So do we.
    batched = set(batch.batched_keys)
    flat = dict(batch.flat_keys)
    cpu = set(batch.keep_on_cpu_keys)
    fields = {}
    for key, tensor in wire.items():
        on_cpu = key in cpu
        if key in batched:
            _check_batched(key, tensor, num_items, where)
            fields[key] = MultiModalFieldConfig.batched(modality, keep_on_cpu=on_cpu)
        elif key in flat and _is_extents(wire.get(flat[key])):
            # A padded batch of items of different shapes: each cut to its extent, batched.
            fields[key] = MultiModalFieldConfig.batched(modality, keep_on_cpu=on_cpu)
        elif key in flat:
            sizes = _flat_sizes(key, flat[key], wire, batched, num_items, where)
            fields[key] = MultiModalFieldConfig.flat_from_sizes(modality, sizes, keep_on_cpu=on_cpu)
        else:
            fields[key] = MultiModalFieldConfig.shared(modality, num_items, keep_on_cpu=on_cpu)
    return fields


def _check_batched(key: str, tensor: torch.Tensor, num_items: int, where: str) -> None:
    if tensor.ndim == 0 or tensor.shape[0] != num_items:
        raise InvalidRequest(
            f"{where}: batched tensor {key!r} has shape {list(tensor.shape)}, "
            f"expected first dimension {num_items} (one per placeholder)"
        )


def _is_extents(sizes: torch.Tensor | None) -> bool:
    """Whether a flat key's sizes tensor holds a row of extents per item (a column per trailing
    dimension of a zero-padded batch) rather than one row count per item."""
    return sizes is not None and sizes.ndim == 2 and sizes.shape[1] > 1


def _unpadded(
    key: str, padded: torch.Tensor, sizes_key: str, wire: dict, batch, num_items: int, where: str
) -> list[torch.Tensor]:
    """Each item of a padded batch cut to its extent, as vLLM's processors cut Pixtral's
    (`p[:, :h, :w]`) so that an item never depends on the others sent with it."""
    extents, field = wire[sizes_key], f"{where}.flat_keys[{key!r}]"
    if sizes_key not in batch.batched_keys:
        raise InvalidRequest(f"{field}: sizes tensor {sizes_key!r} must be in batched_keys")
    dims = extents.shape[1]
    if len(padded) != num_items or len(extents) != num_items or padded.ndim <= dims:
        raise InvalidRequest(
            f"{field}: extents {list(extents.shape)} from {sizes_key!r} do not cut {key!r} of "
            f"shape {list(padded.shape)} into {num_items} items"
        )
    items = []
    for item, extent in zip(padded, extents.tolist()):
        if not all(1 <= e <= d for e, d in zip(extent, item.shape[-dims:])):
            raise InvalidRequest(f"{field}: extent {extent} lies outside {list(item.shape)}")
        items.append(item[(..., *(slice(0, e) for e in extent))])
    return items


def _flat_sizes(
    key: str, sizes_key: str, wire: dict, batched: set[str], num_items: int, where: str
) -> torch.Tensor:
    if sizes_key not in wire:
        raise InvalidRequest(f"{where}.flat_keys[{key!r}]: sizes tensor {sizes_key!r} was not sent")
    if sizes_key not in batched:
        raise InvalidRequest(
            f"{where}.flat_keys[{key!r}]: sizes tensor {sizes_key!r} must be in batched_keys"
        )
    sizes = wire[sizes_key].flatten().to(torch.int64)
    if sizes.numel() != num_items or sizes.sum().item() != wire[key].shape[0]:
        raise InvalidRequest(
            f"{where}.flat_keys[{key!r}]: sizes {sizes.tolist()} from {sizes_key!r} do not split "
            f"{key!r} of first dimension {wire[key].shape[0]} into {num_items} items "
            "(the sizes tensor must hold one row count per item)"
        )
    return sizes


def _placeholders(batch, ids: torch.Tensor, where: str) -> list[PlaceholderRange]:
    im_token_id = batch.im_token_id if batch.HasField("im_token_id") else None
    ranges = []
    for i, p in enumerate(batch.mm_placeholders):
        if p.length == 0 or p.offset + p.length > ids.numel():
            raise InvalidRequest(
                f"{where}.mm_placeholders[{i}]: range ({p.offset}, {p.length}) lies outside "
                f"the {ids.numel()} prompt tokens"
            )
        is_embed = None
        if im_token_id is not None:
            mask = ids[p.offset : p.offset + p.length] == im_token_id
            if not mask.any():
                raise InvalidRequest(
                    f"{where}.mm_placeholders[{i}]: no token equals im_token_id {im_token_id}"
                )
            is_embed = None if mask.all() else mask
        ranges.append(PlaceholderRange(offset=p.offset, length=p.length, is_embed=is_embed))
    return ranges


def _check_overlaps(placeholders: dict[str, list[PlaceholderRange]]) -> None:
    spans = sorted((r.offset, r.offset + r.length) for rs in placeholders.values() for r in rs)
    for (_, end), (start, _) in zip(spans, spans[1:]):
        if start < end:
            raise InvalidRequest("mm_placeholders: placeholder ranges overlap")


def _content_hashes(mm_kwargs: MultiModalKwargsItems, modality: str) -> list[str]:
    # Without client hashes the encoder cache still needs a content key per item: hash what
    # the encoder will see, so equal tensors share an entry and different ones never do.
    hashes = []
    for item in mm_kwargs[modality]:
        hasher = blake3.blake3()
        for key in sorted(item):
            data = item[key].data
            hasher.update(key.encode())
            if isinstance(data, torch.Tensor):
                hasher.update(str((data.dtype, tuple(data.shape))).encode())
                hasher.update(data.contiguous().view(torch.uint8).numpy().tobytes())
        hashes.append(hasher.hexdigest())
    return hashes
