"""The preprocessed-media cache (`--mm-processor-cache-gb`, vLLM's name): items' tensors by
their hash, so that a multi-turn chat resending its images is not decoded and preprocessed
again on every turn.

Keyed by `multimodal.hashing.item_hash`, which covers the item's bytes, its family, every
processor option and the pixel encoding: a key can never hand back tensors made with other
settings (SMG's pixel cache keys by the bytes alone). Values are `ItemShare`s of items
processed one at a time, so they join with any others (`ItemProcessor.join`). Bounded in bytes
(each share's tensors and a counted overhead), least recently used out first; thread-safe:
requests preprocess in worker threads. Per gateway process, as vLLM's "lru" cache is per API
process.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from multimodal.processors.items import ItemShare

GIB = 1 << 30

__all__ = ["GIB", "CacheStats", "MediaCache"]


@dataclass(frozen=True)
class CacheStats:
    hits: int
    misses: int
    evictions: int
    bytes: int
    items: int
    capacity: int


class MediaCache:
    def __init__(self, capacity_bytes: int) -> None:
        """`capacity_bytes`: the most the held shares may take (> 0; a disabled cache is none
        at all, not an empty one)."""
        if capacity_bytes <= 0:
            raise ValueError("a media cache needs a positive capacity")
        self.capacity = capacity_bytes
        self._items: OrderedDict[str, ItemShare] = OrderedDict()
        self._lock = threading.Lock()
        self._bytes = self._hits = self._misses = self._evictions = 0

    @classmethod
    def from_gib(cls, gib: float) -> MediaCache | None:
        """The cache `--mm-processor-cache-gb` asks for; None for 0 (disabled)."""
        if gib < 0:
            raise ValueError("the media cache size cannot be negative")
        return cls(int(gib * GIB)) if gib > 0 else None

    def get(self, key: str) -> ItemShare | None:
        with self._lock:
            share = self._items.get(key)
            if share is None:
                self._misses += 1
                return None
            self._items.move_to_end(key)
            self._hits += 1
            return share

    def put(self, key: str, share: ItemShare) -> bool:
        """Keeps `share` as the most recently used, pushing the least recently used out as
        needed; False (and nothing pushed out) when it alone is larger than the cache, which
        then serves it uncached as vLLM does."""
        size = share.nbytes
        if size > self.capacity:
            return False
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:  # two requests raced to process the same item
                self._bytes -= old.nbytes
            while self._items and self._bytes + size > self.capacity:
                _, evicted = self._items.popitem(last=False)
                self._bytes -= evicted.nbytes
                self._evictions += 1
            self._items[key] = share
            self._bytes += size
            return True

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(
                self._hits,
                self._misses,
                self._evictions,
                self._bytes,
                len(self._items),
                self.capacity,
            )

    def __contains__(self, key: str) -> bool:  # no LRU touch, no counting: for tests and tools
        with self._lock:
            return key in self._items
