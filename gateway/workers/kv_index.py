"""What each worker's engine really holds in its prefix cache, from its KV events.

A worker that answers `SubscribeKvEvents` (mmgate's engine with --kv-events-config, vLLM's own
gRPC server with it) streams every block its engine stores and evicts. The index keys those
blocks as the router keys a prompt's blocks (gateway.workers.routing.block_hashes: token ids
chained on the parent, plus each overlapping multimodal item's hash and offset), not by the
engine's own block hashes: those depend on the engine's hash algorithm and seed
(`--prefix-caching-hash-algo`, PYTHONHASHSEED), which the gateway cannot know, while the
content keys are the same for any engine. SMG keys its event-driven index the same way.

Only device-tier blocks count (a block offloaded to host memory is not a prefix-cache hit
without a connector). A store whose parent block the index does not know (stored before the
subscription began, or its event lost) cannot be placed in a chain and is skipped; its
children are skipped with it, so the index under-counts rather than invents.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from gateway.workers.routing import chain_key, item_key
from protos import common_pb2

log = logging.getLogger("mmgate.gateway")
_DEVICE = (common_pb2.KV_CACHE_TIER_UNSPECIFIED, common_pb2.KV_CACHE_TIER_DEVICE)


@dataclass
class WorkerBlocks:
    block_size: int = 0  # 0 until the first store says
    by_engine: dict[int, int] = field(default_factory=dict)  # engine hash -> content key
    held: dict[int, int] = field(default_factory=dict)  # content key -> physical copies
    unplaced: int = 0  # stores skipped for an unknown parent


class KvEventIndex:
    def __init__(self) -> None:
        self._workers: dict[str, WorkerBlocks] = {}

    def following(self, url: str) -> bool:
        return url in self._workers

    def follow(self, url: str) -> None:
        """Start (or restart: a resubscription) from nothing known."""
        self._workers[url] = WorkerBlocks()

    def forget(self, url: str) -> None:
        self._workers.pop(url, None)

    def block_size(self, url: str) -> int:
        worker = self._workers.get(url)
        return worker.block_size if worker else 0

    def blocks(self, url: str) -> int:
        worker = self._workers.get(url)
        return len(worker.held) if worker else 0

    def matched_blocks(self, url: str, hashes: list[int]) -> int:
        """Leading blocks of `hashes` (keyed in the worker's block size) the worker holds."""
        worker = self._workers.get(url)
        if worker is None:
            return 0
        count = 0
        for key in hashes:
            if key not in worker.held:
                break
            count += 1
        return count

    def apply(self, url: str, batch: common_pb2.KvEventBatch) -> None:
        worker = self._workers.get(url)
        if worker is None:
            return
        for event in batch.events:
            kind = event.WhichOneof("data")
            if kind == "cleared":
                self._workers[url] = worker = WorkerBlocks(worker.block_size)
            elif kind == "stored" and event.stored.tier in _DEVICE:
                _store(worker, event.stored)
            elif kind == "removed" and event.removed.tier in _DEVICE:
                _remove(worker, event.removed.block_hashes)


def _store(worker: WorkerBlocks, stored: common_pb2.KvBlocksStored) -> None:
    previous = 0
    if stored.HasField("parent_block_hash"):
        parent = worker.by_engine.get(stored.parent_block_hash)
        if parent is None:
            worker.unplaced += 1
            return
        previous = parent
    for block in stored.blocks:
        previous = chain_key(previous, tuple(block.token_ids), _extra_keys(block))
        worker.by_engine[block.block_hash] = previous
        worker.held[previous] = worker.held.get(previous, 0) + 1
        worker.block_size = block.block_size or worker.block_size


def _remove(worker: WorkerBlocks, engine_hashes) -> None:
    for engine_hash in engine_hashes:
        key = worker.by_engine.get(engine_hash)
        if key is None:
            continue
        copies = worker.held.get(key, 0) - 1
        if copies > 0:
            worker.held[key] = copies
        else:
            worker.held.pop(key, None)
            del worker.by_engine[engine_hash]


def _extra_keys(block: common_pb2.KvBlock) -> tuple:
    """The block's extra keys as routing.block_hashes keys a prompt's: multimodal items as
    (item_key(hash), offset); any other key (a LoRA name, a cache salt, an embedding digest)
    keyed so that no prompt the gateway routes matches it (it sends neither)."""
    keys = []
    for key in block.extra_keys:
        which = key.WhichOneof("key")
        if which == "multimodal":
            keys.append((item_key(key.multimodal.identifier), key.multimodal.offset))
        elif which is not None:
            keys.append((item_key(f"{which}:{getattr(key, which)!r}"), None))
    return tuple(keys)


async def follow_worker(
    index: KvEventIndex, url: str, subscribe: Callable, retry_seconds: float = 5.0
) -> None:
    """Apply `url`'s KV event stream to `index` until cancelled. `subscribe()` opens the
    SubscribeKvEvents call. UNIMPLEMENTED (the worker publishes none) ends the task: the
    router keeps guessing for that worker. Any other failure (DATA_LOSS: the worker's relay
    lost events; the worker restarted) forgets what the index knew, and subscribes again."""
    while True:
        try:
            call = subscribe(common_pb2.SubscribeKvEventsRequest())
            await call.initial_metadata()
            index.follow(url)
            log.info("following the KV events of worker %s", url)
            async for batch in call:
                index.apply(url, batch)
        except grpc.aio.AioRpcError as error:
            index.forget(url)
            if error.code() == grpc.StatusCode.UNIMPLEMENTED:
                log.info("worker %s publishes no KV events; routing by guess", url)
                return
            log.warning("KV events of worker %s ended (%s); resubscribing", url, error.code())
        except asyncio.CancelledError:
            index.forget(url)
            raise
        else:
            index.forget(url)
        await asyncio.sleep(retry_seconds)
