"""The gateway's mirror of a worker's item cache (send-once): held items are left out, new ones
kept within the worker's bound, evictions decided by the mirror and never of an item a request
in flight left out; whatever order the worker applies requests in, it never lacks an item left
out and never passes its bound (checked against the worker's real cache); a miss is forgotten."""

from __future__ import annotations

import random

import pytest
from vllm.multimodal.inputs import MultiModalKwargsItem

from engine_server.mm_item_cache import ItemCache
from gateway.workers.send_once import MAX_LISTED, ItemMirror


def test_an_item_is_left_out_once_the_worker_showed_it_kept_it():
    mirror = ItemMirror(1000, "w")
    first = mirror.plan([("a", 100), ("b", 200)])
    assert first.store == ("a", "b") and first.cached == () and mirror.used == 300
    early = mirror.plan([("a", 100)])  # sent before the worker answered the first: in full
    assert early.empty
    first.confirm()
    again = mirror.plan([("a", 100), ("b", 200), ("a", 100), ("c", 50)])
    assert again.cached == ("a", "b") and again.store == ("c",)
    assert again.saved_bytes == 400  # every occurrence left out
    assert mirror.plan([("a", 100)], omit=False).cached == ()  # a resend: everything in full


def test_room_is_made_by_evicting_the_least_recently_used_held_items():
    mirror = ItemMirror(1000, "w")
    for key in "abc":
        mirror.plan([(key, 300)]).confirm()
    mirror.plan([("a", 300)]).confirm()  # a used again: b is now the oldest
    plan = mirror.plan([("d", 500)])
    assert plan.evict == ("b", "c") and plan.store == ("d",)
    assert mirror.used == 1400  # evictions count until the worker has applied them
    blocked = mirror.plan([("e", 100)])
    assert blocked.store == () and blocked.evict == ()  # no room: sent in full, not kept
    plan.confirm()
    assert mirror.used == 800 and not mirror.held("b") and mirror.held("d")


def test_an_item_a_request_in_flight_left_out_is_not_evicted():
    mirror = ItemMirror(1000, "w")
    mirror.plan([("a", 600)]).confirm()
    using = mirror.plan([("a", 600)])
    assert using.cached == ("a",)
    assert mirror.plan([("b", 600)]).store == ()  # a is pinned: b cannot be kept
    using.confirm()
    later = mirror.plan([("b", 600)])
    assert later.evict == ("a",) and later.store == ("b",)


def test_a_failed_call_evicts_what_it_may_have_kept_and_repeats_its_evictions():
    mirror = ItemMirror(1000, "w")
    mirror.plan([("a", 600)]).confirm()
    plan = mirror.plan([("b", 600)])
    assert plan.evict == ("a",)
    plan.fail()
    assert mirror.used == 1200 and not mirror.held("a") and not mirror.held("b")
    follow = mirror.plan([("c", 10)])
    assert set(follow.evict) == {"a", "b"} and follow.store == ()  # no room until applied
    follow.confirm()
    assert mirror.used == 0 and not mirror.entries


def test_a_miss_forgets_the_items_and_nothing_else():
    mirror = ItemMirror(1000, "w")
    mirror.plan([("a", 100), ("b", 100)]).confirm()
    plan = mirror.plan([("a", 100), ("b", 100)])
    mirror.missed(["a"])
    plan.fail()
    assert not mirror.held("a") and mirror.held("b") and mirror.used == 100
    assert mirror.plan([("a", 100)]).store == ("a",)


def test_a_renewed_mirror_is_empty_with_a_higher_partition_number():
    mirror = ItemMirror(1000, "w", "gw")
    mirror.plan([("a", 100)]).confirm()
    fresh = mirror.renewed("w")
    assert not fresh.entries and fresh.used == 0 and fresh.partition > mirror.partition
    assert (fresh.sender, fresh.max_bytes) == ("gw", 1000)
    call = fresh.plan([("a", 100)]).call
    assert (call.sender, call.partition, call.store) == ("gw", fresh.partition, ("a",))


def test_a_call_carries_its_sender_and_partition_in_metadata():
    from protos.extensions import (
        ItemCacheCall,
        item_cache_call,
        item_cache_call_metadata,
    )

    call = ItemCacheCall("life", ("a",), ("b",), ("c",), "gw", 7)
    assert item_cache_call(item_cache_call_metadata(call)) == call
    assert item_cache_call([("mmgate-mm-cache-instance", "life")]) == ItemCacheCall("life")
    with pytest.raises(ValueError, match="mmgate-mm-partition"):
        item_cache_call([("mmgate-mm-cache-instance", "life"), ("mmgate-mm-partition", "-1")])


def test_too_large_items_and_long_lists_are_sent_in_full():
    mirror = ItemMirror(1000, "w")
    assert mirror.plan([("huge", 1001)]).empty
    many = mirror.plan([(f"k{i}", 1) for i in range(MAX_LISTED + 10)])
    assert len(many.store) == MAX_LISTED


def item(nbytes: int) -> MultiModalKwargsItem:
    return MultiModalKwargsItem.dummy(nbytes)


@pytest.mark.parametrize("senders", [1, 3])
@pytest.mark.parametrize("seed", range(8))
def test_any_arrival_order_leaves_the_worker_holding_every_item_left_out(seed, senders):
    """Requests sent one after another (by one gateway, or by several interleaving, each
    with its own mirror of its partition) reach the worker in a random order (concurrent
    streams), some fail before the worker sees them and some after it applied them; the
    worker's real cache never misses an item left out, never drops one by itself, never
    lets a sender pass its share nor evict another's items, never passes its bound."""
    rng = random.Random(seed)
    bound = 4000 * senders
    worker = ItemCache(bound, "life", senders=senders)
    share = worker.info.max_bytes
    mirrors = [ItemMirror(share, "life", f"gw{i}") for i in range(senders)]
    sizes = {f"h{i}": rng.choice([300, 700, 1200, 2500]) for i in range(14)}
    sent, arrived = [], []  # plans with each request's items
    hits = 0
    for _ in range(600 * senders):
        action = rng.random()
        if action < 0.35 or not (sent or arrived):
            mirror = rng.choice(mirrors) if senders > 1 else mirrors[0]  # (seeds as before)
            keys = rng.sample(sorted(sizes), rng.randint(1, 3))
            sent.append((mirror.plan([(k, sizes[k]) for k in keys]), keys))
        elif action < 0.75 and sent:
            plan, keys = sent.pop(rng.randrange(len(sent)))
            if rng.random() < 0.1:  # lost before the worker saw it
                plan.fail()
                continue
            call = plan.call
            found = worker.lookup(call)  # raises on a miss: the guarantee under test
            hits += len(found)
            worker.update(call, {k: item(sizes[k]) for k in keys if k not in found})
            assert worker.used <= bound and worker.self_evictions == 0
            arrived.append(plan)
        elif arrived:
            plan = arrived.pop(rng.randrange(len(arrived)))
            plan.confirm() if rng.random() < 0.9 else plan.fail()  # failed after applying
        for mirror in mirrors:  # each mirror counts all its partition holds
            assert set(worker.keys(mirror.sender)) <= set(mirror.entries)
            assert worker.partition_used(mirror.sender) <= share
    assert hits > 20 * senders  # (the run did leave items out)
    assert len(worker.sender_ids) == senders


def test_the_safety_net_recovers_a_keep_the_mirror_lost():
    """A call cancelled while the worker built its prompt: the worker kept an item the mirror
    evicted after, then dropped another by itself; the next request misses and is told."""
    from engine_server.errors import CacheMissError

    mirror, worker = ItemMirror(1000, "life"), ItemCache(1000, "life")
    first = mirror.plan([("a", 600)])
    worker.update(first.call, {"a": item(600)})
    first.confirm()
    lost = mirror.plan([("b", 600)])  # evicts a
    lost.fail()  # the gateway gave up; the worker applies it later still
    follow = mirror.plan([("c", 300)])  # carries the evictions of a and b: no room for c
    worker.update(follow.call, {})
    follow.confirm()
    worker.update(lost.call, {"b": item(600)})  # the late keep: b held, unknown to the mirror
    mirror.plan([("c", 300)]).confirm()  # c kept by the mirror...
    worker.update(mirror.plan([]).call, {})
    keep_c = mirror.plan([("c", 300)])
    assert keep_c.cached == ("c",)
    with pytest.raises(CacheMissError):  # ...but the worker never received it with keep
        worker.lookup(keep_c.call)


def test_admin_workers_shows_the_mirror():
    import asyncio

    from gateway.server.admin import describe
    from gateway.workers.worker import Worker
    from protos.extensions import ItemCacheInfo

    async def listed() -> list:
        worker = Worker("grpc://127.0.0.1:1")
        try:
            plain = describe(worker)["mm_item_cache"]
            worker.reset_items(ItemCacheInfo(1000, "life"))
            worker.mm_items.plan([("a", 300)]).confirm()
            return [plain, describe(worker)["mm_item_cache"]]
        finally:
            await worker.close()

    assert asyncio.run(listed()) == [None, {"max_bytes": 1000, "bytes": 300, "items": 1}]
