"""The workers behind the gateway: round-robin over the healthy ones, checked periodically.

The minimum the gateway needs; routing policies, failover and admission are their own work.
"""

from __future__ import annotations

import asyncio
import itertools
import logging

from gateway.errors import GatewayError
from gateway.metrics import GaugesFrom
from gateway.worker import Worker, WorkerFacts

log = logging.getLogger("mmgate.gateway")


class WorkerPool:
    def __init__(self, urls: list[str], health_interval: float = 5.0) -> None:
        if not urls:
            raise ValueError("at least one --worker is required")
        self.workers = [Worker(url) for url in urls]
        self._turn = itertools.count()
        self._interval = health_interval
        self._task: asyncio.Task | None = None

    async def start(self) -> WorkerFacts:
        """Connect to every worker; the first one that answers describes the model."""
        facts = None
        for worker in self.workers:
            try:
                found = await worker.connect()
                facts = facts or found
            except Exception as error:  # noqa: BLE001 - a down worker is retried by health checks
                log.warning("worker %s not reachable at start: %s", worker.url, error)
        if facts is None:
            raise RuntimeError("no worker answered GetModelInfo; is any --worker running?")
        self._task = asyncio.create_task(self._check_forever())
        return facts

    def pick(self) -> Worker:
        healthy = [w for w in self.workers if w.healthy and w.facts is not None]
        if not healthy:
            raise GatewayError("no healthy engine worker is available; try again later", 503)
        return healthy[next(self._turn) % len(healthy)]

    async def tokenizer_bundle(self) -> tuple[bytes, str]:
        """The model files from the first worker that sends them (see model_files)."""
        for worker in self.workers:
            if worker.facts is None:
                continue
            try:
                return await worker.tokenizer_bundle()
            except Exception as error:  # noqa: BLE001 - the next worker may answer
                log.warning("worker %s sent no tokenizer bundle: %s", worker.url, error)
        raise RuntimeError("no worker sent its tokenizer bundle (GetTokenizer)")

    def any_healthy(self) -> bool:
        return any(w.healthy for w in self.workers)

    def collector(self) -> GaugesFrom:
        """Per-worker gauges for /metrics, read from the workers at scrape time."""
        return GaugesFrom(
            [
                ("mmgate_worker_healthy", "1 if the worker passes health checks", ["worker"]),
                ("mmgate_worker_requests_in_flight", "calls open on the worker", ["worker"]),
            ],
            lambda: {
                "mmgate_worker_healthy": [([w.url], float(w.healthy)) for w in self.workers],
                "mmgate_worker_requests_in_flight": [
                    ([w.url], float(w.in_flight)) for w in self.workers
                ],
            },
        )

    async def _check_forever(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            await asyncio.gather(*(self._check(w) for w in self.workers))

    async def _check(self, worker: Worker) -> None:
        if worker.facts is None:
            try:
                await worker.connect()
            except Exception:  # noqa: BLE001
                return
        await worker.check_health()

    async def close(self) -> None:
        if self._task:
            self._task.cancel()
        await asyncio.gather(*(w.close() for w in self.workers))
