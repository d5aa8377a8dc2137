"""Image-aware cache routing: block keys with multimodal items as vLLM's prefix cache keys them,
and the index of what workers really hold from their KV events."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from types import SimpleNamespace

import grpc
import pytest
from vllm.v1.core.kv_cache_utils import _gen_mm_extra_hash_keys

from gateway.workers.kv_index import KvEventIndex, follow_worker
from gateway.workers.routing import Router, block_hashes, chain_key, item_key
from protos import common_pb2

PAD = 151655  # an image placeholder token: every image expands to the same ones


@dataclass(eq=False)
class W:
    url: str
    assigned: int = 0


def image_prompt(image: str, text: int = 20, pad: int = 40, tail: int = 50):
    """`text` tokens, an image of `pad` placeholders, then `tail` tokens; its item span."""
    ids = list(range(1, text + 1)) + [PAD] * pad + list(range(500, 500 + tail))
    return ids, [(text, pad, image)]


def vllm_block_keys(spans, start: int, end: int) -> list:
    """vLLM's own extra keys for a block, from a request shaped as its scheduler's."""
    features = [
        SimpleNamespace(identifier=h, mm_position=SimpleNamespace(offset=o, length=n))
        for o, n, h in sorted(spans)
    ]
    keys, _ = _gen_mm_extra_hash_keys(SimpleNamespace(mm_features=features), start, end, 0)
    return keys


@pytest.mark.parametrize("size", [16, 4])
def test_block_keys_are_vllms_extra_keys(size):
    ids = list(range(100)) + [PAD] * 37 + [7] * 30 + [PAD] * 9 + [8] * 20
    spans = [(100, 37, "img-a"), (167, 9, "img-b")]
    previous, expected = 0, []
    for start in range(0, len(ids) - size + 1, size):
        keys = vllm_block_keys(spans, start, start + size)
        mine = tuple((item_key(identifier), offset) for _, identifier, offset in keys)
        previous = chain_key(previous, tuple(ids[start : start + size]), mine)
        expected.append(previous)
    assert block_hashes(ids, spans, size) == expected
    # the blocks that hold an item carry keys, and the text-only ones hash as they always did
    assert any(vllm_block_keys(spans, s, s + size) for s in range(0, len(ids), size))
    assert block_hashes(ids[:96], (), size) == block_hashes(ids[:96], spans, size)


def test_two_images_differ_from_their_first_placeholder_block_on():
    ids_a, mm_a = image_prompt("a")
    ids_b, mm_b = image_prompt("b")
    assert ids_a == ids_b  # the same tokens: only the item hashes tell them apart
    a, b = block_hashes(ids_a, mm_a), block_hashes(ids_b, mm_b)
    assert a[0] == b[0]  # tokens 0-15: text only
    assert all(x != y for x, y in zip(a[1:], b[1:]))  # 16-31 hold the image's start
    # the same image at another offset in identical blocks is another block (vLLM's offset)
    shifted = block_hashes(ids_a, [(21, 39, "a")])
    assert shifted[1] != a[1]


def test_cache_aware_routes_a_turn_by_its_image():
    ws, router = [W("w0"), W("w1")], Router("cache_aware")
    ids, mm_x = image_prompt("x")
    first = router.choose(ws, ids, mm_x)
    again = router.choose(ws, ids, mm_x)
    assert (again.worker, again.outcome) == (first.worker, "cache_hit")
    other = router.choose(ws, ids, [(20, 40, "y")])  # same text, another image
    assert other.outcome == "cache_miss"  # one text block of six matches, below threshold


# ---- the index of real cache state ----


def stored_event(ids, spans, size, parent=None, first=0, engine_hash=lambda i: 1000 + i):
    """vLLM's BlockStored for blocks `first`.. of `ids`, as our engine relays it: block hashes
    of the engine's own (unrelated to the gateway's keys), extra keys untagged."""
    blocks = []
    for index in range(first, len(ids) // size):
        start = index * size
        block = common_pb2.KvBlock(
            block_hash=engine_hash(index), token_ids=ids[start : start + size], block_size=size
        )
        for _, identifier, offset in vllm_block_keys(spans, start, start + size):
            key = common_pb2.KvMultimodalKey(identifier=identifier, offset=offset)
            block.extra_keys.append(common_pb2.KvBlockExtraKey(multimodal=key))
        blocks.append(block)
    stored = common_pb2.KvBlocksStored(blocks=blocks, tier=common_pb2.KV_CACHE_TIER_DEVICE)
    if parent is not None:
        stored.parent_block_hash = parent
    return common_pb2.KvCacheEvent(stored=stored)


def batch(*events) -> common_pb2.KvEventBatch:
    return common_pb2.KvEventBatch(events=list(events))


def test_the_index_holds_what_events_store_and_forgets_what_they_remove():
    index, size = KvEventIndex(), 16
    ids, mm = image_prompt("x")  # 110 tokens: 6 full blocks
    index.follow("w0")
    index.apply("w0", batch(stored_event(ids, mm, size)))
    keys = block_hashes(ids, mm, size)
    assert index.matched_blocks("w0", keys) == 6
    assert index.matched_blocks("w0", block_hashes(ids, [(20, 40, "y")], size)) == 1
    removed = common_pb2.KvBlocksRemoved(block_hashes=[1003])  # the 4th block is evicted
    index.apply("w0", batch(common_pb2.KvCacheEvent(removed=removed)))
    assert index.matched_blocks("w0", keys) == 3
    index.apply("w0", batch(common_pb2.KvCacheEvent(cleared=common_pb2.KvCacheCleared())))
    assert (index.matched_blocks("w0", keys), index.blocks("w0"), index.block_size("w0")) == (
        0,
        0,
        16,
    )


def test_a_store_chains_on_its_parent_in_the_engines_block_size():
    index, size = KvEventIndex(), 4
    ids, mm = image_prompt("x", text=6, pad=10, tail=8)  # 24 tokens: 6 blocks of 4
    index.follow("w0")
    head = stored_event(ids[:12], mm, size)  # blocks 0-2
    tail = stored_event(ids, mm, size, parent=1002, first=3)  # blocks 3-5, after block 2
    orphan = stored_event(ids, mm, size, parent=999, first=3, engine_hash=lambda i: 2000 + i)
    index.apply("w0", batch(head, tail, orphan))
    assert index.matched_blocks("w0", block_hashes(ids, mm, size)) == 6
    assert index.blocks("w0") == 6  # the orphan's parent is unknown: not placed
    host = stored_event(ids, [(6, 10, "z")], size)
    host.stored.tier = common_pb2.KV_CACHE_TIER_HOST
    index.apply("w0", batch(host))
    assert index.blocks("w0") == 6  # host-tier copies are not prefix-cache hits


def test_the_router_prefers_real_state_over_its_guess():
    """w0 was sent the prompt (the guess says it holds it), but its events say it evicted
    everything; w1's events say it holds it."""
    events = KvEventIndex()
    ws = [W("w0"), W("w1")]
    router = Router("cache_aware", events=events, pending_seconds=0.0)
    ids, mm = image_prompt("x")
    router.prefixes.insert("w0", block_hashes(ids, mm))
    for url in ("w0", "w1"):
        events.follow(url)
    events.apply("w1", batch(stored_event(ids, mm, 16)))
    decision = router.choose(ws, ids, mm)
    assert (decision.worker.url, decision.outcome, decision.matched_tokens) == (
        "w1",
        "cache_hit",
        96,
    )
    # a worker whose events have not caught up keeps what it was just sent
    router.pending_seconds = 60.0
    assert router.choose(ws, list(range(900, 1000)), ()).outcome == "cache_miss"
    picked = router.choose(ws, list(range(900, 1000)), ())
    assert picked.outcome == "cache_hit"


def _rpc_error(code: grpc.StatusCode) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), "")


class FakeCall:
    def __init__(self, batches, error=None) -> None:
        self.batches, self.error = batches, error

    async def initial_metadata(self):
        if self.error is not None and not self.batches:
            raise self.error
        return grpc.aio.Metadata()

    def __aiter__(self):
        return self._iterate()

    async def _iterate(self):
        for item in self.batches:
            yield item
        if self.error is not None:
            raise self.error


def test_follow_worker_stops_at_unimplemented_and_resubscribes_after_data_loss():
    index = KvEventIndex()
    ids, mm = image_prompt("x")
    calls = [
        FakeCall([batch(stored_event(ids, mm, 16))], _rpc_error(grpc.StatusCode.DATA_LOSS)),
        FakeCall([], _rpc_error(grpc.StatusCode.UNIMPLEMENTED)),
    ]
    seen = []

    def subscribe(request):
        seen.append(index.blocks("w0"))
        return calls.pop(0)

    asyncio.run(asyncio.wait_for(follow_worker(index, "w0", subscribe, retry_seconds=0), 5))
    assert seen == [0, 0]  # the data loss forgot what the first stream had stored
    assert not index.following("w0")
