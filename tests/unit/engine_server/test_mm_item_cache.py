"""The worker's item cache (send-once): items rebuilt from it equal the items sent in full,
a miss refuses the whole request naming every missing item and changes nothing, and the
cache drops only what it is told to, unless keeping an item would pass its bound. Each
sender has its own partition, bounded by an equal share; one sender too many drops the
least recently used partition whole, which its sender learns by a `partition=gone` miss."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from vllm.multimodal.inputs import MultiModalKwargsItem

from engine_server.errors import CacheMissError, status_for
from engine_server.mm_inputs import PixelContract, build_mm_prompt
from engine_server.mm_item_cache import ItemCache, item_nbytes
from engine_server.servicer import prompt_items
from multimodal.pipeline import Prepared, PreparedItems
from multimodal.processors.base import ProcessedItems
from multimodal.wire import flatten
from protos import vllm_engine_pb2 as pb
from protos.extensions import CacheMiss, ItemCacheCall, cache_miss

CONTRACT = PixelContract(device_normalizes=False, model_dtype=torch.float32)
IMAGE_TOKEN = 7


def qwen_like(grids: list[tuple[int, int, int]], seed: int = 0) -> ProcessedItems:
    """A batch laid out as multimodal.processors.qwen_vl lays it out: flat pixel rows per
    item (t*h*w of them, counted by patches_per_image), a grid per item."""
    rng = np.random.default_rng(seed)
    sizes = [t * h * w for t, h, w in grids]
    return ProcessedItems(
        tensors={
            "pixel_values": rng.standard_normal((sum(sizes), 12), dtype=np.float32),
            "image_grid_thw": np.array(grids, dtype=np.int64),
            "patches_per_image": np.array(sizes, dtype=np.int64),
        },
        batched_keys=("image_grid_thw", "patches_per_image"),
        flat_keys={"pixel_values": "patches_per_image"},
        replacements=[[IMAGE_TOKEN] * (t * h * w // 4) for t, h, w in grids],
    )


def prepared(grids=((1, 4, 4), (1, 4, 8)), hashes=("a" * 64, "b" * 64)) -> Prepared:
    processed = qwen_like(list(grids))
    ids, ranges = [1], []
    for replacement in processed.replacements:
        ranges.append((len(ids), len(replacement)))
        ids += replacement + [2]
    return Prepared(ids, [PreparedItems("image", processed, ranges, list(hashes))], "float32")


def request(p: Prepared, tensors=None) -> pb.GenerateRequest:
    head = pb.GenerateRequest(tokenized=pb.TokenizedInput(input_ids=p.prompt_ids))
    return pb.GenerateRequest.FromString(
        b"".join([head.SerializeToString(), *flatten(p.request_nodes(tensors))])
    )


def build(req: pb.GenerateRequest, cached=None):
    batches = [req.mm_inputs, *req.extra_mm_inputs]
    return build_mm_prompt(list(req.tokenized.input_ids), batches, CONTRACT, cached=cached)


def assert_same_items(a, b) -> None:
    assert a["mm_hashes"] == b["mm_hashes"]
    assert a["mm_placeholders"] == b["mm_placeholders"]
    for modality, items in a["mm_kwargs"].items():
        other = b["mm_kwargs"][modality]
        assert len(items) == len(other)
        for x, y in zip(items, other):
            assert x == y  # MultiModalKwargsItem: same keys, fields and tensors


@pytest.mark.parametrize("left_out", [[0], [1], [0, 1]])
def test_items_left_out_are_rebuilt_from_the_cache_as_sent_in_full(left_out):
    from multimodal.processors.items import subset_items

    p = prepared()
    full = build(request(p))
    by_hash = prompt_items(full)
    cached = {p.parts[0].hashes[i]: by_hash[p.parts[0].hashes[i]] for i in left_out}
    sent = [i for i in range(2) if i not in left_out]
    req = request(p, [subset_items(p.parts[0].processed, sent)])
    if not sent:
        assert not req.mm_inputs.HasField("pixel_values")
    assert_same_items(build(req, cached), full)


def test_a_left_out_item_the_worker_lacks_is_not_guessed():
    p = prepared()
    from multimodal.processors.items import subset_items

    req = request(p, [subset_items(p.parts[0].processed, [1])])
    with pytest.raises(Exception, match="more items|split|pixel|first dimension"):
        build(req)  # no cache: the lone item's tensors cannot pass for two items


def item(nbytes: int) -> MultiModalKwargsItem:
    return MultiModalKwargsItem.dummy(nbytes)


def test_a_miss_names_every_missing_item_and_changes_nothing():
    cache = ItemCache(1000, "life-1")
    cache.update(ItemCacheCall("life-1", store=("a",)), {"a": item(100)})
    call = ItemCacheCall("life-1", cached=("a", "b", "c", "b"), evict=("a",))
    with pytest.raises(CacheMissError) as raised:
        cache.lookup(call)
    assert raised.value.miss == CacheMiss("life-1", ("b", "c"))
    assert status_for(raised.value).name == "FAILED_PRECONDITION"
    assert cache_miss(str(raised.value)) == CacheMiss("life-1", ("b", "c"))
    assert "a" in cache and cache.used == 100


def test_another_life_of_the_cache_misses_everything_left_out():
    cache = ItemCache(1000, "life-2")
    cache.update(ItemCacheCall("life-2", store=("a",)), {"a": item(100)})
    with pytest.raises(CacheMissError) as raised:
        cache.lookup(ItemCacheCall("life-1", cached=("a",)))
    assert raised.value.miss == CacheMiss("life-2", ("a",))
    cache.update(ItemCacheCall("life-1", evict=("a",)), {})  # another life's orders: ignored
    assert "a" in cache


def test_the_cache_keeps_and_drops_what_it_is_told():
    cache = ItemCache(1000, "x")
    items = {"a": item(300), "b": item(300), "c": item(300)}
    cache.update(ItemCacheCall("x", store=("a", "b")), items)
    cache.update(ItemCacheCall("x", store=("c",), evict=("a",)), items)
    assert set(cache.keys()) == {"b", "c"} and cache.used == 600
    assert cache.lookup(ItemCacheCall("x", cached=("b",))) == {"b": items["b"]}
    cache.update(ItemCacheCall("x", evict=("b", "zz")), items)  # an absent one: nothing
    assert set(cache.keys()) == {"c"} and cache.self_evictions == 0


def test_past_its_bound_the_cache_drops_its_least_recent_items_itself():
    cache = ItemCache(1000, "x")
    items = {k: item(400) for k in "abc"}
    cache.update(ItemCacheCall("x", store=("a", "b")), items)
    cache.lookup(ItemCacheCall("x", cached=("a",)))  # a is now the more recent
    cache.update(ItemCacheCall("x", store=("c",)), items)
    assert set(cache.keys()) == {"a", "c"} and cache.used == 800 and cache.self_evictions == 1
    cache.update(ItemCacheCall("x", store=("big",)), {"big": item(1001)})  # never fits
    assert "big" not in cache and cache.used == 800


def test_an_items_size_is_its_tensors_bytes():
    assert item_nbytes(item(123)) == 123
    built = build(request(prepared()))
    first = prompt_items(built)["a" * 64]
    assert item_nbytes(first) == 16 * 12 * 4 + 3 * 8 + 8  # its float32 rows, grid, count


def call(sender: str, partition: int = 1, **orders) -> ItemCacheCall:
    return ItemCacheCall("x", sender=sender, partition=partition, **orders)


def test_each_sender_has_its_own_share_and_evicts_only_its_own_items():
    cache = ItemCache(1000, "x", senders=2)
    assert cache.info.max_bytes == 500 and cache.info.senders == 2  # what a mirror fills
    items = {k: item(200) for k in ("a1", "a2", "a3", "b1", "b2")}
    cache.update(call("A", store=("a1", "a2")), items)
    cache.update(call("B", store=("b1", "b2")), items)
    cache.update(call("A", store=("a3",)), items)  # past A's share: A's oldest goes
    assert set(cache.keys("A")) == {"a2", "a3"} and set(cache.keys("B")) == {"b1", "b2"}
    assert cache.self_evictions == 1 and cache.used == 800
    cache.update(call("B", evict=("a2",)), items)  # B cannot drop what A holds
    assert "a2" in cache.keys("A")
    with pytest.raises(CacheMissError) as raised:  # nor use it
        cache.lookup(call("B", cached=("a2",)))
    assert raised.value.miss == CacheMiss("x", ("a2",))
    assert cache.lookup(call("A", cached=("a2",))) == {"a2": items["a2"]}


def test_one_sender_too_many_drops_the_least_recently_used_partition_whole():
    cache = ItemCache(900, "x", senders=3)
    items = {k: item(100) for k in ("a", "b", "c", "d")}
    for sender in "ABC":
        cache.update(call(sender, store=(sender.lower(),)), items)
    cache.lookup(call("A", cached=("a",)))  # A used again: B is the least recent
    cache.update(call("D", store=("d",)), items)
    assert cache.sender_ids == ["C", "A", "D"] and cache.partitions_dropped == 1
    assert cache.used == 300 and "b" not in cache
    with pytest.raises(CacheMissError) as raised:
        cache.lookup(call("B", cached=("b",)))
    assert raised.value.miss == CacheMiss("x", ("b",), gone=True)
    assert cache_miss(str(raised.value)) == raised.value.miss
    # B's old mirror's orders start nothing (it would believe b still held) ...
    cache.update(call("B", store=("b",)), items)
    assert "B" not in cache.sender_ids and cache.lookup(call("B")) == {}
    # ... its new mirror (a higher number) starts afresh, dropping the least recent (C).
    cache.update(call("B", partition=2, store=("b",)), items)
    assert cache.sender_ids == ["A", "D", "B"] and cache.used == 300
    assert cache.lookup(call("B", partition=2, cached=("b",))) == {"b": items["b"]}


def test_a_senders_new_mirror_replaces_its_partition_and_old_orders_are_ignored():
    cache = ItemCache(1000, "x", senders=2)
    items = {k: item(100) for k in "abc"}
    cache.update(call("A", 1, store=("a", "b")), items)
    cache.update(call("A", 2, store=("c",)), items)  # the sender's mirror was renewed
    assert list(cache.keys("A")) == ["c"] and cache.used == 100
    cache.update(call("A", 1, store=("a",), evict=("c",)), items)  # a late older order
    assert list(cache.keys("A")) == ["c"]
    with pytest.raises(CacheMissError) as raised:
        cache.lookup(call("A", 1, cached=("c",)))
    assert raised.value.miss.gone


def test_a_flushed_cache_tells_every_sender_its_partition_is_gone():
    cache = ItemCache(1000, "x", senders=2)
    items = {k: item(100) for k in "ab"}
    cache.update(call("A", store=("a",)), items)
    cache.update(call("B", store=("b",)), items)
    cache.clear()
    assert cache.used == 0 and len(cache) == 0
    for sender, key in (("A", "a"), ("B", "b")):
        cache.update(call(sender, store=(key,)), items)  # an order sent before the flush
        with pytest.raises(CacheMissError) as raised:
            cache.lookup(call(sender, cached=(key,)))
        assert raised.value.miss.gone


def test_a_gateway_sending_no_sender_id_gets_its_partition_started_again():
    """A gateway from before partitions (no sender id, no `partition=gone`): after a flush
    its keeps are taken again, so that it still leaves items out."""
    cache = ItemCache(1000, "x", senders=2)
    old, items = ItemCacheCall("x", store=("a",)), {"a": item(100)}
    cache.update(old, items)
    cache.clear()
    cache.update(old, items)
    assert cache.lookup(ItemCacheCall("x", cached=("a",))) == items
