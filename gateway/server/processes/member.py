"""What a child process of a multi-process gateway holds of the whole: its index, the shared
table (admission, readiness), its line to the supervisor, the metrics directory and the
response store all processes share."""

from __future__ import annotations

import asyncio
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

from starlette.datastructures import State

from gateway.api.responses.memory_store import StoreLimits, StoreObserver
from gateway.api.responses.sqlite_store import SqliteResponseStore
from gateway.observability.metrics import GatewayMetrics
from gateway.server.config import AdmissionConfig
from gateway.server.processes.control import ControlChannel
from gateway.server.processes.shared import ProcessTable, SharedAdmission
from gateway.workers.pool import WorkerPool

PUBLISH_SECONDS = 0.25  # how old another process's view in /metrics and the admin view may be


@dataclass
class Member:
    index: int
    table: ProcessTable
    control: ControlChannel
    metrics_dir: Path
    store_path: Path
    _task: asyncio.Task | None = field(default=None, init=False)

    def admission(self, limits: AdmissionConfig) -> SharedAdmission:
        return SharedAdmission(
            self.table, self.index, limits.max_in_flight, limits.max_queue, limits.queue_timeout
        )

    def metrics(self) -> GatewayMetrics:
        return GatewayMetrics(self.metrics_dir, self.index)

    def response_store(self, limits: StoreLimits, observer: StoreObserver) -> SqliteResponseStore:
        """The gateway's stored responses, whichever process stored them."""
        return SqliteResponseStore(self.store_path, limits, observer)

    def attach(self, state: State, pool: WorkerPool, metrics: GatewayMetrics) -> None:
        """In the app's lifespan, once the pool has started."""
        self.control.attach(pool)
        pool.router.share_turns(self.table.turns())
        self._task = asyncio.create_task(self._keep(state, metrics))

    async def _keep(self, state: State, metrics: GatewayMetrics) -> None:
        """Ready in the shared table once the services are built (the gateway is ready when
        every process is); this process's metrics published for the scraped one."""
        while True:
            self.table.set_ready(self.index, state.services is not None)
            metrics.publish()
            await asyncio.sleep(PUBLISH_SECONDS if state.services is not None else 0.1)

    async def detach(self) -> None:
        self.table.set_ready(self.index, False)
        self.control.detach()
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task

    def all_ready(self) -> bool:
        return self.table.all_ready()
