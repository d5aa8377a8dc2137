"""The response store of a gateway run as several processes (`--api-server-count N`): one
SQLite database (the standard library's sqlite3) that every process opens, so a response stored
through one process is found through all of them (GET /v1/responses/{id}, previous_response_id).

It keeps memory_store.InMemoryResponseStore's semantics: each response is the same JSON,
counted the same (`entry_size`), held within the same bounds (bytes: least recently used out
first; age: counted from the last write), reported to the same observer. Each call is one
transaction begun with BEGIN IMMEDIATE: it takes the write lock at once, since even a read
writes (it renews the entry's use) and the bounds must be enforced by one process at a time.
The calls run on one thread of this process (the only one that uses its connection), so the
event loop never waits on another process's lock.

The observer is told inside the transaction, under the lock: the processes' reports of the
store's size are then made in the order of their writes, so the most recent one is the store's
(process_metrics.py reads it once instead of summing).

The database lives as long as the gateway (the supervisor removes it at exit), on one machine:
WAL with synchronous=NORMAL survives a killed process, and there is nothing to keep through a
power loss; time.monotonic is machine-wide (CLOCK_MONOTONIC), so every process ages entries on
one clock.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing, contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TypeVar

from gateway.api.responses.memory_store import StoreLimits, StoreObserver, entry_size
from gateway.api.responses.store import StoredResponse

log = logging.getLogger("mmgate.gateway")
T = TypeVar("T")
BUSY_TIMEOUT = 30.0  # seconds a process waits for another's transaction (each is short)

# `used` orders entries by their last use (the next to be pushed out has the lowest); the
# triggers keep the totals, which the byte bound and the observer read after every change.
SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    data BLOB NOT NULL,
    size INTEGER NOT NULL,
    stored_at REAL NOT NULL,
    used INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_used ON responses (used);
CREATE INDEX IF NOT EXISTS responses_stored_at ON responses (stored_at);
CREATE TABLE IF NOT EXISTS totals (
    one INTEGER PRIMARY KEY CHECK (one = 0),
    entries INTEGER NOT NULL,
    bytes INTEGER NOT NULL
);
INSERT OR IGNORE INTO totals VALUES (0, 0, 0);
CREATE TRIGGER IF NOT EXISTS responses_counted AFTER INSERT ON responses BEGIN
    UPDATE totals SET entries = entries + 1, bytes = bytes + new.size;
END;
CREATE TRIGGER IF NOT EXISTS responses_uncounted AFTER DELETE ON responses BEGIN
    UPDATE totals SET entries = entries - 1, bytes = bytes - old.size;
END;
"""


class SqliteResponseStore:
    """A `ResponseStore` in a SQLite file shared by the processes of one gateway."""

    def __init__(
        self,
        path: Path,
        limits: StoreLimits | None = None,
        observer: StoreObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = Path(path)
        self.limits = limits or StoreLimits()
        self._observer = observer or StoreObserver()
        self._clock = clock
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="response-store")
        self._db: sqlite3.Connection | None = None

    @staticmethod
    def create(path: Path) -> None:
        """Make the database, before the processes that share it start (none of them then
        races another to make it)."""
        with closing(_connect(path)):
            pass

    @property
    def total_bytes(self) -> int:
        return self._sync(lambda: self._totals(self._connection())[1])

    def __len__(self) -> int:
        return self._sync(lambda: self._totals(self._connection())[0])

    def ids(self) -> list[str]:
        """The ids held, least recently used first (the next to be pushed out)."""
        query = "SELECT id FROM responses ORDER BY used"
        return self._sync(lambda: [r[0] for r in self._connection().execute(query)])

    def size(self, response_id: str) -> int | None:
        """What an entry counts against the byte bound."""
        query = "SELECT size FROM responses WHERE id = ?"

        def read() -> int | None:
            row = self._connection().execute(query, (response_id,)).fetchone()
            return None if row is None else row[0]

        return self._sync(read)

    async def put(self, response_id: str, stored: StoredResponse) -> None:
        data = json.dumps(asdict(stored), ensure_ascii=False, separators=(",", ":")).encode()
        await self._call(self._put, response_id, data)

    async def get(self, response_id: str) -> StoredResponse | None:
        return await self._call(self._get, response_id)

    async def delete(self, response_id: str) -> bool:
        return await self._call(self._delete, response_id)

    async def close(self) -> None:
        await self._call(self._close)
        self._executor.shutdown()

    # On the store's thread:

    def _put(self, response_id: str, data: bytes) -> None:
        with self._write() as db:
            db.execute("DELETE FROM responses WHERE id = ?", (response_id,))
            size = entry_size(response_id, data)
            if size > self.limits.max_bytes:
                if self.limits.max_bytes:
                    log.warning(
                        "response %s (%d bytes) is larger than the response store (%d bytes): "
                        "not kept",
                        response_id,
                        size,
                        self.limits.max_bytes,
                    )
                self._observer.evicted("too_large")
                self._report(db)
                return
            db.execute(
                "INSERT INTO responses VALUES (?, ?, ?, ?, ?)",
                (response_id, data, size, self._clock(), _next_use(db)),
            )
            self._expire(db)
            self._shrink(db)
            self._report(db)

    def _get(self, response_id: str) -> StoredResponse | None:
        with self._write() as db:
            self._expire(db)
            row = db.execute("SELECT data FROM responses WHERE id = ?", (response_id,)).fetchone()
            if row is not None:  # recently used: the last to be pushed out
                db.execute(
                    "UPDATE responses SET used = ? WHERE id = ?", (_next_use(db), response_id)
                )
            self._report(db)
        return None if row is None else StoredResponse(**json.loads(row[0]))

    def _delete(self, response_id: str) -> bool:
        with self._write() as db:
            removed = db.execute("DELETE FROM responses WHERE id = ?", (response_id,)).rowcount
            self._report(db)
        return removed > 0

    def _expire(self, db: sqlite3.Connection) -> None:
        """Drop entries past the age bound (counted from their last write)."""
        oldest = self._clock() - self.limits.max_age_seconds
        expired = db.execute("DELETE FROM responses WHERE stored_at < ?", (oldest,)).rowcount
        if expired:
            self._observer.evicted("age", expired)

    def _shrink(self, db: sqlite3.Connection) -> None:
        evicted = 0
        while self._totals(db)[1] > self.limits.max_bytes:
            db.execute(
                "DELETE FROM responses WHERE id = (SELECT id FROM responses ORDER BY used LIMIT 1)"
            )
            evicted += 1
        if evicted:
            self._observer.evicted("size", evicted)

    def _report(self, db: sqlite3.Connection) -> None:
        self._observer.sized(*self._totals(db))

    @staticmethod
    def _totals(db: sqlite3.Connection) -> tuple[int, int]:
        entries, total = db.execute("SELECT entries, bytes FROM totals").fetchone()
        return entries, total

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        db = self._connection()
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def _connection(self) -> sqlite3.Connection:
        if self._db is None:
            self._db = _connect(self.path)
        return self._db

    def _close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    async def _call(self, function: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, function, *args)

    def _sync(self, function: Callable[[], T]) -> T:
        return self._executor.submit(function).result()


def _connect(path: Path) -> sqlite3.Connection:
    # isolation_level=None: transactions are the store's own BEGIN IMMEDIATE ... COMMIT.
    db = sqlite3.connect(path, timeout=BUSY_TIMEOUT, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.executescript(f"BEGIN IMMEDIATE;{SCHEMA}COMMIT;")  # (whoever comes first makes it)
    return db


def _next_use(db: sqlite3.Connection) -> int:
    return db.execute("SELECT coalesce(max(used), 0) + 1 FROM responses").fetchone()[0]
