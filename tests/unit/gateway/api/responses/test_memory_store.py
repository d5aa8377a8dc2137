"""The response stores hold their bounds: bytes (least recently used out first), age, entries
too large for them; what they return is what was stored. The in-memory one leaks nothing; the
SQLite one (several gateway processes) behaves the same, and is one store for several processes.
"""

from __future__ import annotations

import asyncio
import gc
import multiprocessing
import random
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gateway.api.responses.memory_store import InMemoryResponseStore, StoreLimits, StoreObserver
from gateway.api.responses.sqlite_store import SqliteResponseStore
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


Store = InMemoryResponseStore | SqliteResponseStore
MakeStore = Callable[..., Store]


@pytest.fixture(params=["memory", "sqlite"])
def make_store(request, tmp_path) -> Iterator[MakeStore]:
    """A store of each kind, made as `InMemoryResponseStore(limits, observer, clock)` is."""
    made: list[SqliteResponseStore] = []

    def make(
        limits: StoreLimits | None = None,
        observer: StoreObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> Store:
        limits = limits or StoreLimits()
        if request.param == "memory":
            return InMemoryResponseStore(limits, observer, clock)
        store = SqliteResponseStore(tmp_path / f"store{len(made)}.sqlite3", limits, observer, clock)
        made.append(store)
        return store

    yield make
    for store in made:
        run(store.close())


def test_it_is_a_response_store():
    store: ResponseStore = InMemoryResponseStore()
    assert isinstance(store, InMemoryResponseStore)


def test_what_is_stored_comes_back_equal_and_apart_from_the_caller_s_objects(make_store):
    store = make_store()
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


def test_unknown_and_deleted_ids_are_none(make_store):
    store = make_store()

    async def go():
        await store.put("a", stored("x"))
        deleted = await store.delete("a")
        return deleted, await store.delete("a"), await store.get("a"), await store.get("b")

    assert run(go()) == (True, False, None, None)
    assert store.total_bytes == 0 and len(store) == 0


def test_past_the_byte_bound_the_least_recently_used_go_first(make_store):
    recorder = Recorder()
    probe = make_store()
    run(probe.put("a", stored("x" * 100)))
    one = probe.total_bytes
    store = make_store(StoreLimits(max_bytes=3 * one + 10), recorder)

    async def go():
        for key in "abc":
            await store.put(key, stored("x" * 100))
        await store.get("a")  # a is now the most recently used
        await store.put("d", stored("x" * 100))
        return [k for k in "abcd" if await store.get(k) is not None]

    assert run(go()) == ["a", "c", "d"]
    assert recorder.evictions == {"size": 1}
    assert recorder.entries == 3 and recorder.bytes == store.total_bytes <= 3 * one + 10


def test_replacing_an_entry_counts_its_new_size_only(make_store):
    store = make_store()

    async def go():
        await store.put("a", stored("x" * 1000))
        await store.put("a", stored("y"))

    run(go())
    alone = make_store()
    run(alone.put("a", stored("y")))
    assert store.total_bytes == alone.total_bytes and len(store) == 1


def test_an_entry_larger_than_the_store_is_not_kept_and_evicts_nothing(make_store):
    recorder = Recorder()
    store = make_store(StoreLimits(max_bytes=2000), recorder)

    async def go():
        await store.put("small", stored("x"))
        await store.put("big", stored("x" * 5000))
        return await store.get("small"), await store.get("big")

    small, big = run(go())
    assert small is not None and big is None
    assert recorder.evictions == {"too_large": 1}


def test_a_zero_byte_store_keeps_nothing(make_store):
    store = make_store(StoreLimits(max_bytes=0))
    run(store.put("a", stored("x")))
    assert run(store.get("a")) is None and store.total_bytes == 0


def test_entries_past_the_age_bound_are_gone_counted_from_their_last_write(make_store):
    clock, recorder = Clock(), Recorder()
    store = make_store(StoreLimits(max_age_seconds=60), recorder, clock)

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


def _write_and_read(path: Path, index: int, count: int) -> None:
    """One gateway process: its responses stored, each read back at once; after its first,
    it waits to find the other's first (so their writes interleave)."""
    store = SqliteResponseStore(path)

    async def go() -> None:
        for n in range(count):
            key = f"resp_{index}_{n:03d}"
            await store.put(key, stored(f"{index}:{n}", n))
            assert await store.get(key) == stored(f"{index}:{n}", n)
            deadline = time.monotonic() + 30
            while n == 0 and await store.get(f"resp_{1 - index}_000") is None:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
        await store.close()

    run(go())


def test_one_sqlite_store_for_several_processes(tmp_path):
    """Two spawned processes write at the same time; a third (this one) finds all of it, with
    the byte total of all of it, and its bound pushes out the least recently used whoever
    stored them."""
    path, count = tmp_path / "responses.sqlite3", 100
    SqliteResponseStore.create(path)
    ctx = multiprocessing.get_context("spawn")
    writers = [ctx.Process(target=_write_and_read, args=(path, i, count)) for i in (0, 1)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(60)
    assert [w.exitcode for w in writers] == [0, 0]

    recorder = Recorder()
    store = SqliteResponseStore(path, StoreLimits(), recorder)
    keys = [f"resp_{i}_{n:03d}" for i in (0, 1) for n in range(count)]
    try:
        assert sorted(store.ids()) == keys
        order = store.ids()  # both processes' writes, interleaved
        assert order != sorted(order)
        for key in keys:
            i, n = map(int, key.split("_")[1:])
            assert run(store.get(key)) == stored(f"{i}:{n}", n)
        assert len(store) == 2 * count
        assert store.total_bytes == sum(store.size(k) for k in keys) == recorder.bytes
        # the last read were process 1's: a bound that holds half of all keeps those
        half = sum(store.size(k) for k in keys[count:])
        bounded = SqliteResponseStore(path, StoreLimits(max_bytes=half), recorder)
        run(bounded.put(keys[-1], stored(f"1:{count - 1}", count - 1)))
        assert bounded.ids() == keys[count:]
        assert recorder.evictions == {"size": count}
        run(bounded.close())
    finally:
        run(store.close())
