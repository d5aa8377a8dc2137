"""Responses created with `background=true`: each runs as a task the request does not wait for,
and `POST /v1/responses/{id}/cancel` can stop it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger("mmgate.gateway")


class BackgroundRuns:
    """The running background responses of this process, by response id."""

    def __init__(self) -> None:
        self._tasks: dict[str, asyncio.Task[Any]] = {}

    def start(self, response_id: str, run: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(run, name=f"response {response_id}")
        self._tasks[response_id] = task
        task.add_done_callback(lambda done: self._finished(response_id, done))

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
        if not task.cancelled() and (error := task.exception()) is not None:
            log.error("background response %s failed", response_id, exc_info=error)
