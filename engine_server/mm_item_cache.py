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

Several gateways send to one worker (`mmgate serve --api-server-count N`, replicas behind
llm-d), each with its own mirror, which would evict what the others' hold and together pass
the bound. So the cache keeps one partition per sender (the id a gateway process sends with
each call), each bounded by an equal share of the total (what the worker advertises as the
bound), at most `senders` of them: a new sender when all are taken drops the least recently
used partition whole. Its sender's mirror then learns it by a miss saying `partition=gone`
(the first request leaving an item out) and starts afresh with a higher partition number,
so it never misses item by item; until then the worker ignores that mirror's orders rather
than start a partition the mirror would believe to hold what it held before.
"""

from __future__ import annotations

import logging
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Mapping

import torch
from vllm.multimodal.inputs import MultiModalKwargsItem

from engine_server.errors import CacheMissError
from protos.extensions import CacheMiss, ItemCacheCall, ItemCacheInfo

log = logging.getLogger("mmgate.engine")
GIB = 1 << 30
# How many senders' partitions a worker keeps at once by default (--mm-item-cache-senders).
DEFAULT_ITEM_SENDERS = 4
# Senders whose partition was dropped, remembered (their last partition number) so that a
# late order of theirs does not start a partition their mirror would misread.
GONE_REMEMBERED = 1024


def item_nbytes(item: MultiModalKwargsItem) -> int:
    """The bytes an item's tensors hold (a shared tensor counted in every item holding it)."""
    return sum(_nbytes(elem.data) for elem in item.values())


def _nbytes(data: object) -> int:
    if isinstance(data, torch.Tensor):
        return data.nbytes
    if isinstance(data, (list, tuple)):
        return sum(_nbytes(d) for d in data)
    return 0


class _Partition:
    """One sender's items, bounded by its share; recency orders the safety net's choice."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.items: OrderedDict[str, tuple[MultiModalKwargsItem, int]] = OrderedDict()
        self.used = 0


class ItemCache:
    """Items by hash, in one partition per sender, each bounded in bytes by an equal share of
    `max_bytes`, dropped when the sender says so."""

    def __init__(self, max_bytes: int, instance: str | None = None, senders: int = 1) -> None:
        if senders < 1 or max_bytes // senders <= 0:
            raise ValueError("an item cache needs a positive byte bound for each sender")
        self.max_bytes, self.senders = max_bytes, senders
        self.share = max_bytes // senders
        self.instance = instance or uuid.uuid4().hex
        self._partitions: OrderedDict[str, _Partition] = OrderedDict()  # least recent first
        self._gone: OrderedDict[str, int] = OrderedDict()
        self.self_evictions = 0
        self.partitions_dropped = 0

    @property
    def info(self) -> ItemCacheInfo:
        return ItemCacheInfo(self.share, self.instance, self.senders)

    @property
    def used(self) -> int:
        return sum(p.used for p in self._partitions.values())

    def __contains__(self, key: str) -> bool:
        return any(key in p.items for p in self._partitions.values())

    def __len__(self) -> int:
        return sum(len(p.items) for p in self._partitions.values())

    def keys(self, sender: str | None = None) -> Iterable[str]:
        """The hashes held (for one sender, or for all)."""
        if sender is not None:
            partition = self._partitions.get(sender)
            return list(partition.items) if partition is not None else []
        return [key for p in self._partitions.values() for key in p.items]

    def partition_used(self, sender: str) -> int:
        partition = self._partitions.get(sender)
        return partition.used if partition is not None else 0

    @property
    def sender_ids(self) -> list[str]:
        """The senders holding a partition, least recently used first."""
        return list(self._partitions)

    def lookup(self, call: ItemCacheCall) -> dict[str, MultiModalKwargsItem]:
        """The items `call` left out; raises CacheMissError naming all of those the cache does
        not hold (all of them when the call mirrors another life of the cache or a partition
        it no longer holds)."""
        wanted = tuple(dict.fromkeys(call.cached))
        if call.instance != self.instance:
            raise CacheMissError(CacheMiss(self.instance, wanted))
        partition = self._partition(call)
        if partition is None:
            if wanted:
                raise CacheMissError(CacheMiss(self.instance, wanted, gone=True))
            return {}
        missing = tuple(h for h in wanted if h not in partition.items)
        if missing:
            raise CacheMissError(CacheMiss(self.instance, missing))
        self._partitions.move_to_end(call.sender)
        found = {}
        for key in call.cached:
            partition.items.move_to_end(key)
            found[key] = partition.items[key][0]
        return found

    def update(self, call: ItemCacheCall, items: Mapping[str, MultiModalKwargsItem]) -> None:
        """After the request's prompt was built: drop what `call` evicts, then keep the items
        it stores, of `items` (the request's items by hash), in the sender's partition."""
        if call.instance != self.instance:
            return
        partition = self._partitions.get(call.sender)
        if partition is not None and partition.number < call.partition:
            del self._partitions[call.sender]  # the sender started a new mirror
            partition = None
        if partition is None:
            if not call.store or self._dropped(call):
                return  # nothing to keep, or a mirror whose partition was dropped
            partition = self._open(call.sender, call.partition)
        elif partition.number > call.partition:
            return  # an order of the sender's previous mirror
        self._partitions.move_to_end(call.sender)
        for key in call.evict:
            self._drop(partition, key)
        for key in call.store:
            if key in items:
                self._put(partition, key, items[key])

    def clear(self) -> None:
        """Forget every item (FlushCache); each sender learns it by a `partition=gone` miss."""
        while self._partitions:
            self._drop_partition()

    def _partition(self, call: ItemCacheCall) -> _Partition | None:
        partition = self._partitions.get(call.sender)
        return partition if partition is not None and partition.number == call.partition else None

    def _dropped(self, call: ItemCacheCall) -> bool:
        """Whether the call's mirror is one whose partition was dropped. (A gateway from
        before partitions sends no sender id, nor knows `partition=gone`: its partition is
        started again, and its mirror recovers item by item as it did.)"""
        return bool(call.sender) and self._gone.get(call.sender, -1) >= call.partition

    def _open(self, sender: str, number: int) -> _Partition:
        while len(self._partitions) >= self.senders:
            dropped = self._drop_partition()
            self.partitions_dropped += 1
            log.info(
                "item cache: dropped the items of sender %s for a new sender (at most %d "
                "kept: --mm-item-cache-senders)",
                dropped,
                self.senders,
            )
        self._gone.pop(sender, None)
        partition = self._partitions[sender] = _Partition(number)
        return partition

    def _drop_partition(self) -> str:
        sender, partition = self._partitions.popitem(last=False)
        self._gone[sender] = partition.number
        self._gone.move_to_end(sender)
        while len(self._gone) > GONE_REMEMBERED:
            self._gone.popitem(last=False)
        return sender

    def _put(self, partition: _Partition, key: str, item: MultiModalKwargsItem) -> None:
        size = item_nbytes(item)
        self._drop(partition, key)
        if size > self.share:
            return  # the sender's mirror has the same bound: it never asks for this
        while partition.used + size > self.share:
            self._drop(partition, next(iter(partition.items)))
            self.self_evictions += 1
        partition.items[key] = (item, size)
        partition.used += size

    @staticmethod
    def _drop(partition: _Partition, key: str) -> None:
        entry = partition.items.pop(key, None)
        if entry is not None:
            partition.used -= entry[1]
