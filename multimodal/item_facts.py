"""What a processor made of one item of a batch, for people to read (`POST /v1/preprocess`,
the playground): each tensor's share of the item, its grid or tile counts, its tokens.

A family's `ProcessedItems` hold every item of a request in one batch, laid out for the engine;
the item's share is cut here as the worker cuts it (`engine_server.mm_inputs`), so what is
shown is what the model receives for that item, whatever the family.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from multimodal.processors.base import ProcessedItems
from multimodal.prompt import Range

# An integer tensor of at most this many values per item is a layout fact worth showing
# (Qwen-VL's image_grid_thw, tile counts, Llama 4's aspect_ratios, LLaVA-NeXT's image_sizes);
# larger ones (Gemma 4's patch positions) are data.
GRID_MAX_VALUES = 8

__all__ = ["GRID_MAX_VALUES", "item_grid", "item_tensors", "placeholder_counts"]


def item_tensors(processed: ProcessedItems, index: int) -> dict[str, np.ndarray]:
    """Each tensor's share of item `index`: its row of a batched tensor; its rows of a flat one
    (by the sizes tensor), or its extents of a zero-padded batch (a sizes tensor with a row of
    extents per item); a shared tensor whole."""
    tensors = processed.tensors
    shares: dict[str, np.ndarray] = {}
    for name, tensor in tensors.items():
        sizes_key = processed.flat_keys.get(name)
        if sizes_key is not None:
            shares[name] = _flat_share(tensor, tensors[sizes_key], index)
        elif name in processed.batched_keys:
            shares[name] = tensor[index]
        else:
            shares[name] = tensor
    return shares


def _flat_share(tensor: np.ndarray, sizes: np.ndarray, index: int) -> np.ndarray:
    if sizes.ndim == 2 and sizes.shape[1] > 1:  # extents, cut from the item's padded slot
        extent = [int(e) for e in sizes[index]]
        return tensor[index][(..., *(slice(0, e) for e in extent))]
    counts = sizes.reshape(-1).astype(np.int64)
    start = int(counts[:index].sum())
    return tensor[start : start + int(counts[index])]


def item_grid(processed: ProcessedItems, shares: dict[str, np.ndarray]) -> dict[str, object]:
    """The small integer tensors of the item (`item_tensors`'s `shares`) that say how it was
    laid out, as plain ints or lists: e.g. {"image_grid_thw": [1, 8, 10],
    "patches_per_image": 80}."""
    grid: dict[str, object] = {}
    for name in processed.batched_keys:
        share = shares[name]
        if np.issubdtype(share.dtype, np.integer) and share.size <= GRID_MAX_VALUES:
            grid[name] = share.tolist()
    return grid


def placeholder_counts(
    prompt_ids: Sequence[int], placeholder: Range, embed_token_id: int | None
) -> tuple[int, int]:
    """(tokens, embeddings): the prompt tokens the item's placeholder takes, and how many of
    them the vision encoder's output fills (fewer where the range holds structural tokens,
    marked by `embed_token_id` being set)."""
    offset, length = placeholder
    if embed_token_id is None:
        return length, length
    span = prompt_ids[offset : offset + length]
    return length, sum(1 for token in span if token == embed_token_id)
