"""The response store of one gateway process: least recently used first out, bounded in bytes and
in age.

vLLM's store is two dicts that grow until the process dies. Here each response is kept as its
JSON encoding, so its size is exact (the bound is on what is held, not on an estimate), nothing
a caller mutates after `put` changes what was stored (as with a store in another process), and
the entries' bytes are one contiguous object each (no graph of small dicts for the collector).
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Literal

from gateway.api.responses.store import StoredResponse

log = logging.getLogger("mmgate.gateway")

# What an entry costs beyond its JSON and id: the bytes object's header, two ordered-dict slots
# and links, the float (measured with tracemalloc in the store's tests, rounded up).
ENTRY_OVERHEAD = 320

# Why an entry left: pushed out by newer ones, too old, or too large to keep at all.
Eviction = Literal["size", "age", "too_large"]


@dataclass(frozen=True)
class StoreLimits:
    max_bytes: int = 256 << 20  # --responses-store-max-mib; 0 keeps nothing
    max_age_seconds: float = 24 * 3600.0  # --responses-store-max-age


class StoreObserver:
    """What the store reports (the gateway's metrics implement it)."""

    def evicted(self, reason: Eviction, count: int = 1) -> None: ...

    def sized(self, entries: int, total_bytes: int) -> None: ...


class InMemoryResponseStore:
    """A `ResponseStore` in this process's memory."""

    def __init__(
        self,
        limits: StoreLimits = StoreLimits(),
        observer: StoreObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = limits
        self._observer = observer or StoreObserver()
        self._clock = clock
        self._entries: OrderedDict[str, bytes] = OrderedDict()  # least recently used first
        # When each was last stored (the age bound counts from there), least recently first.
        self._by_age: OrderedDict[str, float] = OrderedDict()
        self._bytes = 0

    @property
    def total_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def ids(self) -> list[str]:
        """The ids held, least recently used first (the next to be pushed out)."""
        return list(self._entries)

    def size(self, response_id: str) -> int | None:
        """What an entry counts against the byte bound."""
        data = self._entries.get(response_id)
        return None if data is None else entry_size(response_id, data)

    async def put(self, response_id: str, stored: StoredResponse) -> None:
        data = json.dumps(asdict(stored), ensure_ascii=False, separators=(",", ":")).encode()
        self._remove(response_id)
        size = entry_size(response_id, data)
        if size > self.limits.max_bytes:
            if self.limits.max_bytes:
                log.warning(
                    "response %s (%d bytes) is larger than the response store (%d bytes): not kept",
                    response_id,
                    size,
                    self.limits.max_bytes,
                )
            self._observer.evicted("too_large")
            self._report()
            return
        now = self._clock()
        self._entries[response_id] = data
        self._by_age[response_id] = now
        self._bytes += size
        self._expire()
        self._shrink()
        self._report()

    async def get(self, response_id: str) -> StoredResponse | None:
        self._expire()
        entry = self._entries.get(response_id)
        if entry is None:
            self._report()
            return None
        self._entries.move_to_end(response_id)  # recently used: the last to be pushed out
        return StoredResponse(**json.loads(entry))

    async def delete(self, response_id: str) -> bool:
        removed = self._remove(response_id)
        self._report()
        return removed

    def _remove(self, response_id: str) -> bool:
        data = self._entries.pop(response_id, None)
        if data is None:
            return False
        del self._by_age[response_id]
        self._bytes -= entry_size(response_id, data)
        return True

    def _expire(self) -> None:
        """Drop entries past the age bound, from the least recently stored (only those)."""
        oldest = self._clock() - self.limits.max_age_seconds
        expired = 0
        while self._by_age:
            key, stored_at = next(iter(self._by_age.items()))
            if stored_at >= oldest:
                break
            self._remove(key)
            expired += 1
        if expired:
            self._observer.evicted("age", expired)

    def _shrink(self) -> None:
        evicted = 0
        while self._bytes > self.limits.max_bytes:
            key = next(iter(self._entries))
            self._remove(key)
            evicted += 1
        if evicted:
            self._observer.evicted("size", evicted)

    def _report(self) -> None:
        self._observer.sized(len(self._entries), self._bytes)


def entry_size(response_id: str, data: bytes) -> int:
    """What an entry counts against the byte bound (every store counts the same)."""
    return len(data) + len(response_id) + ENTRY_OVERHEAD
