"""Responses created with `background=true`: each runs as a task the request does not wait for,
and `POST /v1/responses/{id}/cancel` can stop it. A streamed one writes its events to a log
that the creating request and any `GET /v1/responses/{id}?stream=true` read, from the start or
after a sequence number."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from gateway.api.responses.store import ResponseStore

log = logging.getLogger("mmgate.gateway")


class Slots(Protocol):
    """The gateway's admission (gateway.server.admission.Admission): a slot per running
    generation, waited for in line."""

    async def enter(self) -> float: ...

    def leave(self) -> None: ...


# Event logs of finished streamed runs kept for replay, the most recent; a running one is
# always kept. (vLLM keeps every log for the life of the process.)
FINISHED_LOGS = 64
# How often a run reads its stored status back when the store is shared by several gateway
# processes: a cancel or DELETE that another process took reaches the run this way.
WATCH_SECONDS = 0.5


class EventLog:
    """A background stream's SSE events, in order: the i-th has sequence_number i."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.ended = False
        self._more = asyncio.Event()

    def append(self, event: str) -> None:
        self.events.append(event)
        self._more.set()

    def end(self) -> None:
        self.ended = True
        self._more.set()

    async def follow(self, starting_after: int | None = None) -> AsyncIterator[str]:
        """The events after sequence number `starting_after` (all without it), then each as
        it comes, until the run ends."""
        sent = 0 if starting_after is None else starting_after + 1
        while True:
            self._more.clear()
            while sent < len(self.events):
                yield self.events[sent]
                sent += 1
            if self.ended:
                return
            await self._more.wait()


class BackgroundRuns:
    """The running background responses of this process, by response id."""

    def __init__(
        self, admission: Slots | None = None, shared_store: ResponseStore | None = None
    ) -> None:
        """`admission`: the gateway's bound on generation requests, which a run holds a slot of
        while it runs (it waits for one, still `queued`, as a request would): background runs
        outlive their requests' slots and would otherwise escape the bound.
        `shared_store`: the store when other gateway processes share it (--api-server-count):
        a run then stops when its stored response is cancelled or deleted, whichever process
        took the cancel or DELETE (a run lives in the process that started it)."""
        self.admission = admission
        self.shared_store = shared_store
        self._tasks: dict[str, asyncio.Task[Any]] = {}
        self._logs: OrderedDict[str, EventLog] = OrderedDict()

    def start(
        self, response_id: str, run: Coroutine[Any, Any, Any], events: EventLog | None = None
    ) -> None:
        """Run `run`; `events`: the log a streamed run writes, kept for replay."""
        task = asyncio.create_task(self._admitted(run), name=f"response {response_id}")
        self._tasks[response_id] = task
        if events is not None:
            self._logs[response_id] = events
        task.add_done_callback(lambda done: self._finished(response_id, done))
        if self.shared_store is not None:
            watcher = asyncio.create_task(self._watch(response_id, task, self.shared_store))
            task.add_done_callback(lambda _: watcher.cancel())

    @staticmethod
    async def _watch(response_id: str, task: asyncio.Task[Any], store: ResponseStore) -> None:
        """Cancel `task` once its stored response is cancelled or gone."""
        while not task.done():
            await asyncio.sleep(WATCH_SECONDS)
            stored = await store.get(response_id)
            if stored is None or stored.response.get("status") == "cancelled":
                task.cancel()
                return

    async def _admitted(self, run: Coroutine[Any, Any, Any]) -> Any:
        if self.admission is None:
            return await run
        try:
            await self.admission.enter()
        except BaseException:
            run.close()  # never started: nothing of it runs
            raise
        try:
            return await run
        finally:
            self.admission.leave()

    def events(self, response_id: str) -> EventLog | None:
        """The event log of a streamed background response, while it runs and for a while
        after (the FINISHED_LOGS most recent)."""
        return self._logs.get(response_id)

    def running(self, response_id: str) -> bool:
        return response_id in self._tasks

    async def cancel(self, response_id: str) -> bool:
        """Stop a run and wait until it has stopped; False when none runs under that id."""
        task = self._tasks.get(response_id)
        if task is None:
            return False
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return True

    async def close(self) -> None:
        """Cancel every run (the gateway is shutting down)."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _finished(self, response_id: str, task: asyncio.Task[Any]) -> None:
        if self._tasks.get(response_id) is task:
            del self._tasks[response_id]
        if (events := self._logs.get(response_id)) is not None:
            events.end()  # (a run cancelled before it began never ended its log)
            self._logs.move_to_end(response_id)
        finished = [key for key in self._logs if key not in self._tasks]
        for key in finished[: max(0, len(finished) - FINISHED_LOGS)]:
            del self._logs[key]
        if not task.cancelled() and (error := task.exception()) is not None:
            log.error("background response %s failed", response_id, exc_info=error)
