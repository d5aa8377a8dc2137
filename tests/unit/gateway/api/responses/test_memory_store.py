"""The in-memory response store holds its bounds: bytes (least recently used out first), age,
entries too large for it; what it returns is what was stored; and it leaks nothing."""

from __future__ import annotations

import asyncio
import gc
import random
import tracemalloc
from collections import Counter

from gateway.api.responses.memory_store import InMemoryResponseStore, StoreLimits, StoreObserver
from gateway.api.responses.store import ResponseStore, StoredResponse


class Recorder(StoreObserver):
    def __init__(self) -> None:
        self.evictions: Counter[str] = Counter()
        self.entries = self.bytes = 0

    def evicted(self, reason: str, count: int = 1) -> None:
        self.evictions[reason] += count

    def sized(self, entries: int, total_bytes: int) -> None:
        self.entries, self.bytes = entries, total_bytes


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def stored(text: str, n: int = 0) -> StoredResponse:
    response = {"id": f"resp_{n}", "status": "completed", "output": [{"text": text}]}
    return StoredResponse(response, [{"id": "msg_1", "type": "message"}], [{"content": text}])


def run(coroutine):
    return asyncio.run(coroutine)


def test_it_is_a_response_store():
    store: ResponseStore = InMemoryResponseStore()
    assert isinstance(store, InMemoryResponseStore)


def test_what_is_stored_comes_back_equal_and_apart_from_the_caller_s_objects():
    store = InMemoryResponseStore()
    original = stored("héllo ☀")

    async def go():
        await store.put("resp_1", original)
        original.response["status"] = "changed after put"
        first = await store.get("resp_1")
        first.response["output"].append("changed after get")
        return first, await store.get("resp_1")

    first, second = run(go())
    assert second == stored("héllo ☀")
    assert first.response["status"] == "completed"


def test_unknown_and_deleted_ids_are_none():
    store = InMemoryResponseStore()

    async def go():
        await store.put("a", stored("x"))
        deleted = await store.delete("a")
        return deleted, await store.delete("a"), await store.get("a"), await store.get("b")

    assert run(go()) == (True, False, None, None)
    assert store.total_bytes == 0 and len(store) == 0


def test_past_the_byte_bound_the_least_recently_used_go_first():
    recorder = Recorder()
    probe = InMemoryResponseStore()
    run(probe.put("a", stored("x" * 100)))
    one = probe.total_bytes
    store = InMemoryResponseStore(StoreLimits(max_bytes=3 * one + 10), recorder)

    async def go():
        for key in "abc":
            await store.put(key, stored("x" * 100))
        await store.get("a")  # a is now the most recently used
        await store.put("d", stored("x" * 100))
        return [k for k in "abcd" if await store.get(k) is not None]

    assert run(go()) == ["a", "c", "d"]
    assert recorder.evictions == {"size": 1}
    assert recorder.entries == 3 and recorder.bytes == store.total_bytes <= 3 * one + 10


def test_replacing_an_entry_counts_its_new_size_only():
    store = InMemoryResponseStore()

    async def go():
        await store.put("a", stored("x" * 1000))
        await store.put("a", stored("y"))

    run(go())
    alone = InMemoryResponseStore()
    run(alone.put("a", stored("y")))
    assert store.total_bytes == alone.total_bytes and len(store) == 1


def test_an_entry_larger_than_the_store_is_not_kept_and_evicts_nothing():
    recorder = Recorder()
    store = InMemoryResponseStore(StoreLimits(max_bytes=2000), recorder)

    async def go():
        await store.put("small", stored("x"))
        await store.put("big", stored("x" * 5000))
        return await store.get("small"), await store.get("big")

    small, big = run(go())
    assert small is not None and big is None
    assert recorder.evictions == {"too_large": 1}


def test_a_zero_byte_store_keeps_nothing():
    store = InMemoryResponseStore(StoreLimits(max_bytes=0))
    run(store.put("a", stored("x")))
    assert run(store.get("a")) is None and store.total_bytes == 0


def test_entries_past_the_age_bound_are_gone_counted_from_their_last_write():
    clock, recorder = Clock(), Recorder()
    store = InMemoryResponseStore(StoreLimits(max_age_seconds=60), recorder, clock)

    async def go():
        await store.put("a", stored("x"))
        clock.now += 30
        await store.put("b", stored("x"))
        await store.get("a")  # a read does not renew it
        clock.now += 31
        first = [await store.get("a"), await store.get("b")]
        await store.put("b", stored("y"))  # a write does
        clock.now += 59
        return first, await store.get("b")

    (a, b), b_later = run(go())
    assert a is None and b is not None and b_later is not None
    assert recorder.evictions == {"age": 1}
    assert len(store) == 1


def test_under_load_the_bound_holds_only_the_oldest_go_and_nothing_leaks():
    """Far more responses than fit, of random sizes: after every put the store is within its
    bound and holds exactly the newest responses that fit; its memory stays near the bound,
    and is given back when they are deleted."""
    bound, count = 1 << 20, 2000
    recorder = Recorder()
    store = InMemoryResponseStore(StoreLimits(max_bytes=bound), recorder)
    rng = random.Random(7)
    # Made before memory is measured: the test's own bookkeeping is not the store's.
    keys = [f"resp_{n:06d}" for n in range(count)]
    lengths = [rng.randrange(10, 20_000) for _ in range(count)]

    probe = InMemoryResponseStore(StoreLimits(max_bytes=bound))
    sizes: dict[str, int | None] = {}

    async def measure() -> None:
        for n, key in enumerate(keys):
            await probe.put(key, stored("z" * lengths[n], n))
            sizes[key] = probe.size(key)
            await probe.delete(key)

    run(measure())

    async def load() -> None:
        for n, key in enumerate(keys):
            await store.put(key, stored("z" * lengths[n], n))
            assert store.total_bytes <= bound

    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    run(load())
    gc.collect()  # the event loop's cycles are not the store's
    held = tracemalloc.get_traced_memory()[0] - before

    kept = store.ids()
    newest_that_fit, total = [], 0
    for key in reversed(list(sizes)):
        if total + sizes[key] > bound:
            break
        newest_that_fit.insert(0, key)
        total += sizes[key]
    assert kept == newest_that_fit
    assert recorder.evictions["size"] == count - len(kept)
    assert store.total_bytes == total
    # What the store says it holds is what the process holds for it (within 10%; the
    # accounting counts each entry's overhead).
    assert held < bound * 1.05, held

    async def forget() -> None:
        for key in kept:
            assert await store.delete(key)

    run(forget())
    gc.collect()
    after = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert store.total_bytes == 0 and len(store) == 0
    assert after < 64 << 10, after  # what is left is the test's own bookkeeping
