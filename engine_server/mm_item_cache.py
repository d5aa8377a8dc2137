"""The worker's half of "send each item once": preprocessed items kept by hash, so that a
gateway sends an item's tensors once and then only its hash and placeholder.

vLLM's API process and engine core do the same with two LRU caches updated in the same order
(vllm/multimodal/cache/lru.py): the sender keeps sizes only and leaves out what the receiver
holds. Over concurrent gRPC streams the requests reach the worker in another order than the
gateway sent them, so two LRUs would drift. Here the cache does not choose what to drop: the
gateway does (gateway/workers/send_once.py), and each request carries which sent items to
keep and which to evict. The worker drops an item by itself only if keeping the ones it was
told to keep would take it past its bound (the gateway's rules leave room for them, so this
is a safety net; counted in `self_evictions`). A request naming an item the cache does not
hold, or another life of the cache (a restarted worker), is refused as a whole, naming every
missing item (`CacheMissError`), before anything is kept or dropped: the gateway then forgets
them and sends that request in full.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Iterable, Mapping

import torch
from vllm.multimodal.inputs import MultiModalKwargsItem

from engine_server.errors import CacheMissError
from protos.extensions import CacheMiss, ItemCacheCall, ItemCacheInfo

GIB = 1 << 30


def item_nbytes(item: MultiModalKwargsItem) -> int:
    """The bytes an item's tensors hold (a shared tensor counted in every item holding it)."""
    return sum(_nbytes(elem.data) for elem in item.values())


def _nbytes(data: object) -> int:
    if isinstance(data, torch.Tensor):
        return data.nbytes
    if isinstance(data, (list, tuple)):
        return sum(_nbytes(d) for d in data)
    return 0


class ItemCache:
    """Items by hash, bounded in bytes, dropped when the sender says so."""

    def __init__(self, max_bytes: int, instance: str | None = None) -> None:
        if max_bytes <= 0:
            raise ValueError("an item cache needs a positive byte bound")
        self.max_bytes = max_bytes
        self.instance = instance or uuid.uuid4().hex
        self._items: OrderedDict[str, tuple[MultiModalKwargsItem, int]] = OrderedDict()
        self.used = 0
        self.self_evictions = 0

    @property
    def info(self) -> ItemCacheInfo:
        return ItemCacheInfo(self.max_bytes, self.instance)

    def __contains__(self, key: str) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def lookup(self, call: ItemCacheCall) -> dict[str, MultiModalKwargsItem]:
        """The items `call` left out; raises CacheMissError naming all of those the cache does
        not hold (all of them when the call mirrors another life of the cache)."""
        if call.instance != self.instance:
            raise CacheMissError(CacheMiss(self.instance, tuple(dict.fromkeys(call.cached))))
        missing = tuple(h for h in dict.fromkeys(call.cached) if h not in self._items)
        if missing:
            raise CacheMissError(CacheMiss(self.instance, missing))
        found = {}
        for key in call.cached:
            self._items.move_to_end(key)  # (recency only orders the safety net's choice)
            found[key] = self._items[key][0]
        return found

    def update(self, call: ItemCacheCall, items: Mapping[str, MultiModalKwargsItem]) -> None:
        """After the request's prompt was built: drop what `call` evicts, then keep the items
        it stores, of `items` (the request's items by hash)."""
        if call.instance != self.instance:
            return
        for key in call.evict:
            self._drop(key)
        for key in call.store:
            if key in items:
                self._put(key, items[key])

    def clear(self) -> None:
        self._items.clear()
        self.used = 0

    def _put(self, key: str, item: MultiModalKwargsItem) -> None:
        size = item_nbytes(item)
        self._drop(key)
        if size > self.max_bytes:
            return  # the sender's mirror has the same bound: it never asks for this
        while self.used + size > self.max_bytes:
            self._drop(next(iter(self._items)))
            self.self_evictions += 1
        self._items[key] = (item, size)
        self.used += size

    def _drop(self, key: str) -> None:
        entry = self._items.pop(key, None)
        if entry is not None:
            self.used -= entry[1]

    def keys(self) -> Iterable[str]:
        return self._items.keys()
