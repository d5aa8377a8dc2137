"""The gateway's half of "send each item once": per worker, a mirror of the items its cache
holds (engine_server/mm_item_cache.py), so that a request leaves out the tensors of items the
worker already has and sends only their hashes and placeholders.

vLLM keeps two LRUs in lockstep (vllm/multimodal/cache/lru.py: the sender's holds sizes only)
and recovers from drift by a miss error and a resend. Over concurrent gRPC streams requests
reach the worker in another order than they were sent, so here the worker's cache does not
evict by itself: the mirror decides, and each request carries which items to keep and which
to evict. An entry's life:

- `pending`: sent in full, to be kept; not left out of other requests until a message from
  the worker for this request shows the worker built its prompt (and kept the item);
- `held`: the worker has it; left out of requests. While a request that left it out is in
  flight it is pinned: no eviction is decided for it, so an eviction cannot overtake the
  request that needs the item;
- `evicting`: an eviction decided (or a keep that may or may not have happened: a request
  failed); never left out nor kept again until a message for the request carrying the
  eviction arrives.

Bytes of every entry, in any state, count against the worker's advertised bound, except that a
request may keep items in the room its own evictions make (the worker applies a request's
evictions before its keeps); so whatever order the worker applies requests in, it stays within
its bound and never has to drop an item by itself (tests/unit/gateway/workers/test_send_once.py
checks this against the worker's real cache over random arrival orders and failures).

Several gateway processes (`--api-server-count`, replicas) send to one worker, each with its
own mirror: the worker keeps a partition per sender (`sender`, made once per gateway process
by its WorkerPool), and advertises one partition's bound, which is what a mirror fills. When
the worker drops a sender's partition (for another sender, or FlushCache) that sender's next
request leaving an item out is refused with `partition=gone`: the worker then holds nothing
for this mirror, so it is replaced whole by one with a higher partition number (`renewed`),
whose keeps start a new partition.

Guarantee: an item left out is held by the worker unless the worker restarted, its cache was
flushed (FlushCache), it dropped this sender's partition for another sender's, or it dropped
an item by itself (a keep the mirror lost track of: a call cancelled while the worker built
its prompt). Each of these is answered by FAILED_PRECONDITION naming every missing item: the
mirror forgets them (or, for another life of the cache or a partition gone, everything) and
the request is sent again in full to the same worker, once (`RetryingGenerate`).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from multimodal.item_facts import item_tensors
from multimodal.pipeline import Prepared
from multimodal.processors.base import ProcessedItems
from multimodal.processors.items import subset_items
from multimodal.wire import Node
from protos.extensions import ItemCacheCall

State = Literal["pending", "held", "evicting"]
# At most this many hashes (64 hex digits each) in a call's metadata lists: gRPC servers take
# 8 KiB of metadata by default. Beyond it, items are sent in full and not kept.
MAX_LISTED = 64
FLOAT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
# Partition numbers: each mirror made in this process gets a higher one than those before, so
# a worker tells a sender's new mirror from one whose partition it dropped (the sender id,
# made per process, keeps forked processes apart).
_PARTITIONS = itertools.count(1)

__all__ = ["ItemMirror", "Plan", "item_sizes", "plan_nodes"]


@dataclass
class _Entry:
    nbytes: int
    state: State
    pins: int = 0  # requests in flight that left it out


@dataclass
class Plan:
    """What one attempt at a worker tells its cache, and the mirror's entries it touched."""

    mirror: ItemMirror
    cached: tuple[str, ...] = ()
    store: tuple[str, ...] = ()
    evict: tuple[str, ...] = ()
    saved_bytes: int = 0  # the tensors left out, every occurrence
    saved_items: int = 0  # the items left out, every occurrence
    entries: dict[str, _Entry] = field(default_factory=dict)
    settled: bool = False

    @property
    def call(self) -> ItemCacheCall:
        m = self.mirror
        return ItemCacheCall(m.instance, self.cached, self.store, self.evict, m.sender, m.partition)

    @property
    def empty(self) -> bool:
        return not (self.cached or self.store or self.evict)

    def confirm(self) -> None:
        """The worker built the request's prompt: it applied the plan."""
        if not self.settled:
            self.settled = True
            self.mirror._confirm(self)

    def fail(self) -> None:
        """The call ended before any message: the plan may or may not have been applied."""
        if not self.settled:
            self.settled = True
            self.mirror._fail(self)


class ItemMirror:
    """Which items one worker's cache (one life of it: `instance`) holds for this sender (in
    its partition number `partition`), bounded in bytes by the bound it advertised."""

    def __init__(
        self, max_bytes: int, instance: str, sender: str = "", partition: int | None = None
    ) -> None:
        self.max_bytes, self.instance, self.sender = max_bytes, instance, sender
        self.partition = next(_PARTITIONS) if partition is None else partition
        self.entries: OrderedDict[str, _Entry] = OrderedDict()  # least recently used first
        self.used = 0
        self._evict_queue: dict[str, None] = {}  # evictions to carry in the next requests

    def plan(self, items: Sequence[tuple[str, int]], omit: bool = True) -> Plan:
        """What a request with these items (hash, bytes on the wire; in prompt order) sends:
        held ones left out (unless `omit` is False: a resend in full), new ones kept where the
        bound allows, with the evictions that make room."""
        plan = Plan(self)
        cached, store, evict = [], [], []
        listed = 0
        sizes = dict(items)
        for key in sizes:
            entry = self.entries.get(key)
            if entry is not None and entry.state == "held":
                self.entries.move_to_end(key)
                if omit and listed < MAX_LISTED:
                    cached.append(key)
                    entry.pins += 1
                    plan.entries[key] = entry
                    listed += 1
        left_out = [size for key, size in items if key in plan.entries]
        plan.saved_items, plan.saved_bytes = len(left_out), sum(left_out)
        for key, size in sizes.items():
            if key in self.entries or size > self.max_bytes or listed >= MAX_LISTED:
                continue  # pending or evicting elsewhere: sent in full, not kept again
            victims = self._room_for(size, MAX_LISTED - listed - 1 - len(evict))
            if victims is None:
                continue
            for victim in victims:
                self.entries[victim].state = "evicting"
                plan.entries[victim] = self.entries[victim]
                evict.append(victim)
            entry = self.entries[key] = _Entry(size, "pending")
            self.used += size
            plan.entries[key] = entry
            store.append(key)
            listed += 1 + len(victims)
        # Evictions still owed (their request failed): carried along, as room allows.
        for key in list(self._evict_queue):
            if listed >= MAX_LISTED:
                break
            del self._evict_queue[key]
            if (entry := self.entries.get(key)) is not None and entry.state == "evicting":
                plan.entries[key] = entry
                evict.append(key)
                listed += 1
        plan.cached, plan.store, plan.evict = tuple(cached), tuple(store), tuple(evict)
        return plan

    def missed(self, keys: Sequence[str]) -> None:
        """The worker does not hold these: forgotten (whoever pinned them misses too)."""
        for key in keys:
            entry = self.entries.pop(key, None)
            if entry is not None:
                self.used -= entry.nbytes
            self._evict_queue.pop(key, None)

    def renewed(self, instance: str) -> ItemMirror:
        """An empty mirror of the same sender, for a cache life (or partition) that holds
        nothing of this one's."""
        return ItemMirror(self.max_bytes, instance, self.sender)

    def held(self, key: str) -> bool:
        entry = self.entries.get(key)
        return entry is not None and entry.state == "held"

    def _room_for(self, size: int, most: int) -> list[str] | None:
        """The least recently used held, unpinned entries to evict so that `size` more bytes
        fit (at most `most` of them), or None if they cannot be found."""
        free, victims = self.max_bytes - self.used, []
        for key, entry in self.entries.items():
            if free >= size:
                break
            if entry.state == "held" and entry.pins == 0 and len(victims) < most:
                victims.append(key)
                free += entry.nbytes
        return victims if free >= size else None

    def _confirm(self, plan: Plan) -> None:
        for key, entry in plan.entries.items():
            if self.entries.get(key) is not entry:
                continue  # forgotten since (a miss): nothing to settle
            if key in plan.cached:
                entry.pins -= 1
            elif key in plan.store:
                entry.state = "held"
            elif key in plan.evict:
                del self.entries[key]
                self.used -= entry.nbytes

    def _fail(self, plan: Plan) -> None:
        for key, entry in plan.entries.items():
            if self.entries.get(key) is not entry:
                continue
            if key in plan.cached:
                entry.pins -= 1
            else:  # a keep that may have happened, an eviction that may not: evict again
                entry.state = "evicting"
                self._evict_queue[key] = None


def item_sizes(prepared: Prepared) -> list[list[int]]:
    """Each item's bytes on the wire, per part: what leaving it out saves, and what the
    worker's cache holds for it (at most: the worker casts floats to the model's dtype, which
    the wire's float dtype is whenever the model's is a float the wire has)."""
    out = []
    for part in prepared.parts:
        processed = part.processed
        out.append(
            [_wire_bytes(processed, i, prepared.float_dtype) for i in range(len(part.ranges))]
        )
    return out


def _wire_bytes(processed: ProcessedItems, index: int, float_dtype: str | None) -> int:
    total = 0
    for array in item_tensors(processed, index).values():
        array = np.asarray(array)
        if float_dtype is not None and np.issubdtype(array.dtype, np.floating):
            total += array.size * FLOAT_BYTES.get(float_dtype, array.itemsize)
        else:
            total += array.nbytes
    return total


def plan_nodes(prepared: Prepared, cached: Sequence[str]) -> list[Node]:
    """`prepared.request_nodes()` without the tensors of the items `cached` names: each part's
    tensors are a batch of the items sent (placeholders and hashes stay, for every item)."""
    left_out = set(cached)
    parts = []
    for part in prepared.parts:
        sent = [i for i, key in enumerate(part.hashes) if key not in left_out]
        if len(sent) == len(part.hashes):
            parts.append(part.processed)
        else:
            parts.append(subset_items(part.processed, sent))
    return prepared.request_nodes(parts)
