"""A child process's line to the supervisor (`--api-server-count`): what one process learns
that the others must know goes up, and comes back down to every other process.

- Runtime worker changes (`/admin/workers`): applied by the process that took the request,
  then sent up; the supervisor keeps the gateway's worker list (a restarted child starts with
  it) and passes the change on.
- Cache-aware routing: each process's Router remembers which worker got which prompt blocks
  (routing.PrefixIndex); every insert is sent up and passed on, so a conversation's next
  turn finds its worker whichever process takes it. Inserts of one event-loop turn go as one
  message, as bytes the supervisor relays without reading them.

Messages are a kind byte and a pickle. Health and circuit state are not shared: each process
has its own connections to the workers, checks them itself and opens a circuit on its own
calls' failures (see README "Several processes").
"""

from __future__ import annotations

import asyncio
import logging
import pickle
from collections.abc import Callable, Sequence
from contextlib import suppress
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from gateway.errors import GatewayError

if TYPE_CHECKING:
    from gateway.workers.pool import WorkerPool

log = logging.getLogger("mmgate.gateway")
WORKERS, ROUTES = b"W", b"R"


def encode(kind: bytes, payload: Any) -> bytes:
    return kind + pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)


def decode(data: bytes) -> tuple[bytes, Any]:
    return data[:1], pickle.loads(data[1:])


class ControlChannel:
    """The child's end of its pipe to the supervisor, read in the event loop."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.pool: WorkerPool | None = None
        self.on_lost: Callable[[], None] = lambda: None  # the supervisor is gone
        self._routes: list[tuple[str, Sequence[int]]] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def attach(self, pool: WorkerPool) -> None:
        """Start applying the other processes' changes to `pool` (in the running loop)."""
        self.pool = pool
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.conn.fileno(), self._readable)
        if pool.router.policy == "cache_aware":
            pool.router.on_insert = self.routed

    def detach(self) -> None:
        if self._loop is not None:
            with suppress(ValueError, OSError):
                self._loop.remove_reader(self.conn.fileno())
            self._loop = None

    # ---- up ----

    def worker_added(self, url: str) -> None:
        self._send(encode(WORKERS, ("add", url)))

    def worker_removed(self, url: str) -> None:
        self._send(encode(WORKERS, ("remove", url)))

    def routed(self, url: str, hashes: Sequence[int]) -> None:
        if not hashes:
            return
        if not self._routes and self._loop is not None:
            self._loop.call_soon(self._flush_routes)
        self._routes.append((url, hashes))

    def _flush_routes(self) -> None:
        routes, self._routes = self._routes, []
        if routes:
            self._send(encode(ROUTES, routes))

    def _send(self, data: bytes) -> None:
        try:
            self.conn.send_bytes(data)
        except OSError:  # the supervisor is gone: we are stopping
            self._lost()

    # ---- down ----

    def _readable(self) -> None:
        try:
            while self.conn.poll():
                self.apply(*decode(self.conn.recv_bytes()))
        except (EOFError, OSError):
            self._lost()

    def apply(self, kind: bytes, payload: Any) -> None:
        pool = self.pool
        if pool is None:
            return
        if kind == ROUTES:
            for url, hashes in payload:
                pool.router.prefixes.insert(url, hashes)
        elif kind == WORKERS:
            op, url = payload
            if op == "add":
                asyncio.get_running_loop().create_task(pool.add(url))
            else:
                with suppress(GatewayError):  # not (or no longer) ours: nothing to drain
                    pool.remove(url)

    def _lost(self) -> None:
        self.detach()
        log.error("the supervisor process is gone: stopping")
        self.on_lost()
