"""One item's share of a `ProcessedItems` batch, and batches joined again from shares.

The preprocessed-media cache (`multimodal.media_cache`) keeps items, not requests: a later
request may carry a cached image next to a new one. A batch is cut into shares as the worker
cuts it (`multimodal.item_facts.item_tensors`, the same rules as `engine_server.mm_inputs`)
and joined by the inverse: flat tensors concatenated, batched ones stacked (zero-padded to the
largest item where items differ in shape, as transformers pads LLaVA-NeXT's tiles and
Pixtral's images), shared ones kept once. A family whose layout itself depends on the batch
(Pixtral: ragged or not; Qwen3-VL videos: one frame count or several) overrides
`ItemProcessor.join` to choose it as its `process` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from multimodal.item_facts import item_tensors
from multimodal.processors.base import ProcessedItems

Kind = Literal["flat", "batched", "shared"]
# What a share costs the cache besides its tensors' bytes: the dicts, arrays' headers and the
# replacement list (a few hundred bytes each). Counted so that a flood of tiny items is
# bounded too.
SHARE_OVERHEAD_BYTES = 1024

__all__ = ["SHARE_OVERHEAD_BYTES", "ItemShare", "join_items", "split_items", "subset_items"]


@dataclass
class ItemShare:
    """One item of a batch: each tensor's share (its rows of a flat tensor, its row of a
    batched one without the batch axis, a shared tensor whole), how each was cut, the item's
    replacement ids, and the batch's layout it came from."""

    tensors: dict[str, np.ndarray]
    kinds: dict[str, Kind]
    replacement: list[int]
    batched_keys: tuple[str, ...] = ()
    flat_keys: dict[str, str] = field(default_factory=dict)
    keep_on_cpu_keys: tuple[str, ...] = ()
    embed_token_id: int | None = None
    encoder_key: str = "pixel_values"

    @property
    def nbytes(self) -> int:
        """What the share holds in memory: its tensors' bytes and a counted overhead."""
        tensors = sum(t.nbytes for t in self.tensors.values())
        return tensors + 8 * len(self.replacement) + SHARE_OVERHEAD_BYTES


def split_items(processed: ProcessedItems, copy: bool = True) -> list[ItemShare]:
    """Each item's share, read-only (a cached share is handed to several requests). Copies, so
    that a cached share does not keep the whole batch alive, unless `copy` is False: for a
    batch of one item, whose shares are its whole arrays (a 37 MB float32 copy per miss is
    about as long as preprocessing a 1280x960 Qwen-VL image)."""
    kinds = _kinds(processed)
    shares = []
    for index, replacement in enumerate(processed.replacements):
        tensors = {k: _frozen(v, copy) for k, v in item_tensors(processed, index).items()}
        shares.append(
            ItemShare(
                tensors,
                dict(kinds),
                list(replacement),
                processed.batched_keys,
                dict(processed.flat_keys),
                processed.keep_on_cpu_keys,
                processed.embed_token_id,
                processed.encoder_key,
            )
        )
    return shares


def join_items(shares: Sequence[ItemShare]) -> ProcessedItems:
    """The batch the shares were cut from (or, for shares of items processed apart, the batch
    processing them together gives), with the first share's layout."""
    if not shares:
        raise ValueError("no items to join")
    first = shares[0]
    for share in shares[1:]:
        if share.kinds != first.kinds:
            raise ValueError(f"items of different layouts: {share.kinds} vs {first.kinds}")
    tensors = {}
    for key, kind in first.kinds.items():
        parts = [s.tensors[key] for s in shares]
        if kind == "flat":
            tensors[key] = np.concatenate(parts) if len(parts) > 1 else parts[0]
        elif kind == "batched":
            tensors[key] = _stacked(parts)
        else:
            if any(not _same(p, parts[0]) for p in parts[1:]):
                raise ValueError(f"shared tensor {key!r} differs between items")
            tensors[key] = parts[0]
    return ProcessedItems(
        tensors=tensors,
        batched_keys=first.batched_keys,
        flat_keys=dict(first.flat_keys),
        keep_on_cpu_keys=first.keep_on_cpu_keys,
        replacements=[list(s.replacement) for s in shares],
        embed_token_id=first.embed_token_id,
        encoder_key=first.encoder_key,
    )


def subset_items(processed: ProcessedItems, indices: Sequence[int]) -> ProcessedItems:
    """The batch of some of the items (in the order given), for the wire: the batch that
    processing them alone gives, as `join_items` of their shares. Transient, so not copied
    where a view does (one item); an empty `indices` gives the layout with no tensors."""
    if not indices:
        return ProcessedItems(
            tensors={},
            batched_keys=processed.batched_keys,
            flat_keys=dict(processed.flat_keys),
            keep_on_cpu_keys=processed.keep_on_cpu_keys,
            replacements=[],
            embed_token_id=processed.embed_token_id,
            encoder_key=processed.encoder_key,
        )
    kinds = _kinds(processed)
    shares = [
        ItemShare(
            {k: np.asarray(v) for k, v in item_tensors(processed, i).items()},
            dict(kinds),
            list(processed.replacements[i]),
            processed.batched_keys,
            dict(processed.flat_keys),
            processed.keep_on_cpu_keys,
            processed.embed_token_id,
            processed.encoder_key,
        )
        for i in indices
    ]
    return join_items(shares)


def _kinds(processed: ProcessedItems) -> dict[str, Kind]:
    kinds: dict[str, Kind] = {}
    for key in processed.tensors:
        if key in processed.flat_keys:
            sizes = processed.tensors[processed.flat_keys[key]]
            # A padded batch with a row of extents per item: its shares are cut to their
            # extents, and stacking pads them again.
            extents = sizes.ndim == 2 and sizes.shape[1] > 1
            kinds[key] = "batched" if extents else "flat"
        elif key in processed.batched_keys:
            kinds[key] = "batched"
        else:
            kinds[key] = "shared"
    return kinds


def _stacked(parts: Sequence[np.ndarray]) -> np.ndarray:
    if len(parts) == 1:
        return parts[0][np.newaxis]  # a view: one cached item joins without a copy
    shape = tuple(max(dims) for dims in zip(*(p.shape for p in parts)))
    if all(p.shape == shape for p in parts):
        return np.stack(parts)
    out = np.zeros((len(parts), *shape), parts[0].dtype)  # zeros: as transformers pads
    for part, slot in zip(parts, out):
        slot[tuple(slice(0, d) for d in part.shape)] = part
    return out


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _frozen(array: np.ndarray | np.generic, copy: bool) -> np.ndarray:
    array = np.asarray(array)  # a batched 1-D tensor's row is a numpy scalar: a 0-d array
    # A view of a larger block (multimodal.native.OUTPUTS carves outputs from kept blocks)
    # would pin more memory than the cache counts: copied whatever `copy` says.
    if copy or _backing_bytes(array) > array.nbytes:
        out = np.array(array, copy=True)
    else:
        out = array.view()  # its own flags: the processor's array stays as it was
    out.flags.writeable = False
    return out


def _backing_bytes(array: np.ndarray) -> int:
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array.nbytes
