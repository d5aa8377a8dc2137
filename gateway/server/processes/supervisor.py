"""The supervisor of `mmgate serve --api-server-count N` (N > 1).

It binds the listening socket, then starts N children (child.py) that all accept on it, each
with its own event loop, app and worker connections. It serves no request itself; it
- relays what one child learns to the others (control.py), keeping the gateway's worker list;
- restarts a child that dies (its admission slots given back, the current worker list handed
  to its successor), unless children die more than MAX_RESTARTS times in RESTART_WINDOW
  seconds: then something is wrong with all of them, and it stops the gateway, exit code 1;
- on SIGTERM or SIGINT, sends SIGTERM to every child: each stops accepting, finishes its open
  requests and streams (uvicorn's graceful shutdown), and exits; the supervisor exits 0 once
  all have, 1 if one did not exit cleanly. A second signal is passed on as SIGINT, which makes
  uvicorn stop without waiting for open requests.
It also makes the children one gateway for /metrics (PROMETHEUS_MULTIPROC_DIR, a fresh
directory removed at exit), for stored responses (one SQLite response store in that directory,
made before any child opens it) and for routing (one PYTHONHASHSEED, so prompt block hashes are
equal in every child).
"""

from __future__ import annotations

import logging
import os
import queue
import secrets
import shutil
import signal
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path

from gateway.api.responses.sqlite_store import SqliteResponseStore
from gateway.server.config import GatewayConfig
from gateway.server.processes.control import WORKERS, decode
from gateway.server.processes.shared import ProcessTable, make_context
from gateway.server.tls import HttpTls

log = logging.getLogger("mmgate.gateway")
MAX_RESTARTS = 5
RESTART_WINDOW = 60.0
RELAY_BACKLOG = 10_000  # routing messages waiting for a busy child; beyond, they are dropped
# In the metrics directory (prometheus_client reads its *.db files: not this name).
RESPONSE_STORE = "responses.sqlite3"


@dataclass
class Child:
    index: int
    process: BaseProcess
    conn: Connection
    outbox: queue.Queue = field(default_factory=queue.Queue)
    writer: threading.Thread | None = None

    def start_writer(self) -> None:
        """Sends to the child from a thread of their own: a child busy for a while fills its
        pipe, which must not stop the supervisor relaying to the others."""
        self.writer = threading.Thread(target=self._write, daemon=True, name=f"to-{self.index}")
        self.writer.start()

    def _write(self) -> None:
        while (data := self.outbox.get()) is not None:
            try:
                self.conn.send_bytes(data)
            except OSError:  # it died: the supervisor's loop sees that
                return

    def send(self, data: bytes, droppable: bool) -> None:
        if droppable and self.outbox.qsize() > RELAY_BACKLOG:
            return  # a routing hint: the child still routes, only less well
        self.outbox.put(data)


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, as uvicorn binds it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


class Supervisor:
    def __init__(
        self,
        count: int,
        config: GatewayConfig,
        host: str,
        port: int,
        log_format: str,
        tls: HttpTls | None = None,
    ) -> None:
        self.count, self.config, self.log_format = count, config, log_format
        self.tls = tls  # each child builds its own SSL context (and refresher) from it
        self.host, self.port = host, port
        self.workers = list(config.workers)  # the gateway's, with /admin/workers changes
        self.children: dict[int, Child] = {}
        self.deaths: list[float] = []
        self.stopping = 0  # signals received (or 1: the supervisor gave up)
        self._sent = 0  # signals passed on to the children
        self.failed = False

    def run(self) -> int:
        sock = bind(self.host, self.port)
        metrics_dir = Path(tempfile.mkdtemp(prefix="mmgate-metrics-"))
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
        os.environ.setdefault("PYTHONHASHSEED", str(secrets.randbelow(1 << 32)))
        self.store_path = metrics_dir / RESPONSE_STORE
        SqliteResponseStore.create(self.store_path)
        self.ctx = make_context()
        self.table = ProcessTable(self.ctx, self.count)
        self.sock, self.metrics_dir = sock, metrics_dir
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)
        scheme = "https" if self.tls else "http"
        log.info(
            "serving on %s://%s:%d with %d processes", scheme, self.host, self.port, self.count
        )
        try:
            for index in range(self.count):
                self._start(index)
            self._loop()
        finally:
            for child in self.children.values():
                child.outbox.put(None)
            sock.close()
            shutil.rmtree(metrics_dir, ignore_errors=True)
        return 1 if self.failed else 0

    def _start(self, index: int) -> None:
        ours, theirs = self.ctx.Pipe()
        config = replace(self.config, workers=list(self.workers))
        from gateway.server.processes.child import run_child

        process = self.ctx.Process(
            target=run_child,
            args=(
                index,
                config,
                self.sock,
                self.table,
                theirs,
                self.log_format,
                self.metrics_dir,
                self.store_path,
                self.tls,
            ),
            name=f"mmgate-gateway-{index}",
        )
        process.start()
        theirs.close()
        child = Child(index, process, ours)
        child.start_writer()
        self.children[index] = child
        log.info("gateway process %d started (pid %d)", index, process.pid)

    def _loop(self) -> None:
        while self.children:
            if self.stopping:
                self._signal_children()
            by_conn = {c.conn: c for c in self.children.values()}
            by_sentinel = {c.process.sentinel: c for c in self.children.values()}
            for ready in wait([*by_conn, *by_sentinel], timeout=0.2):
                if ready in by_conn:
                    self._receive(by_conn[ready])
                elif ready in by_sentinel:
                    self._exited(by_sentinel[ready])

    def _receive(self, child: Child) -> None:
        try:
            data = child.conn.recv_bytes()
        except (EOFError, OSError):
            child.process.join(5)  # it is exiting: its sentinel follows
            self._exited(child)
            return
        if data[:1] == WORKERS:
            op, url = decode(data)[1]
            if op == "add" and url not in self.workers:
                self.workers.append(url)
            elif op == "remove" and url in self.workers:
                self.workers.remove(url)
        for other in self.children.values():
            if other is not child:
                other.send(data, droppable=data[:1] != WORKERS)

    def _exited(self, child: Child) -> None:
        if self.children.get(child.index) is not child:
            return  # (seen through both its pipe and its sentinel)
        child.process.join()
        del self.children[child.index]
        child.outbox.put(None)
        child.conn.close()
        code = child.process.exitcode
        self._forget(child)
        if self.stopping:
            # uvicorn exits by the signal it stopped on, once its requests are done
            if code not in (0, -signal.SIGTERM):
                log.error("gateway process %d exited with %s while stopping", child.index, code)
                self.failed = True
            return
        log.error(
            "gateway process %d (pid %d) exited with %s", child.index, child.process.pid, code
        )
        now = time.monotonic()
        self.deaths = [t for t in self.deaths if now - t < RESTART_WINDOW] + [now]
        if len(self.deaths) > MAX_RESTARTS:
            log.error(
                "%d gateway processes died within %g s: stopping the gateway",
                len(self.deaths),
                RESTART_WINDOW,
            )
            self.failed = True
            self.stopping = 1
            return
        self._start(child.index)

    def _forget(self, child: Child) -> None:
        """A dead child's admission slots and metrics: its counters stay counted, its gauges
        and scrape-time snapshot go."""
        from prometheus_client.multiprocess import mark_process_dead

        from gateway.observability.process_metrics import snapshot_path

        self.table.reclaim(child.index)
        mark_process_dead(child.process.pid, str(self.metrics_dir))
        snapshot_path(self.metrics_dir, child.index).unlink(missing_ok=True)

    def _on_signal(self, signum: int, frame: object) -> None:
        self.stopping += 1

    def _signal_children(self) -> None:
        """SIGTERM once (graceful), then SIGINT for each further signal (at once)."""
        if self._sent >= self.stopping:
            return
        signum = signal.SIGTERM if self._sent == 0 else signal.SIGINT
        if self._sent == 0:
            log.info("stopping: %d gateway processes finish their requests", len(self.children))
        for child in self.children.values():
            if child.process.pid is not None and child.process.exitcode is None:
                os.kill(child.process.pid, signum)
        self._sent = self.stopping
