"""/admin/workers: see, add and remove engine workers at runtime.

GET lists every worker with its state; POST {"url": "grpc://HOST:PORT"} adds one (it gets
traffic once it answers); DELETE {"url": ...} stops routing to it and drops it once its requests
have finished. Guarded by the API key when one is set. With several gateway processes
(`--api-server-count`), the process that took the change passes it to the others through the
supervisor (processes/control.py); GET shows the state as the answering process sees it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from starlette.datastructures import State

from gateway.errors import parse_body
from gateway.workers.worker import Worker


class WorkerRef(BaseModel):
    url: str


def describe(worker: Worker) -> dict[str, Any]:
    return {
        "url": worker.url,
        "healthy": worker.healthy,
        "eligible": worker.eligible,
        "connected": worker.facts is not None,
        "draining": worker.draining,
        "refused": worker.refused,  # why it is not used ("": it is), e.g. another model
        "circuit": worker.breaker.state,
        "assigned_requests": worker.assigned,
        "calls_in_flight": worker.in_flight,
        "requests_total": worker.requests,
        # URL schemes it preprocesses media from (media_refs); empty: it takes tensors only
        "media_ref_schemes": sorted(worker.facts.media_ref_schemes) if worker.facts else [],
    }


async def list_workers(state: State, body: None) -> dict:
    return {
        "policy": state.pool.router.policy,
        "workers": [describe(w) for w in state.pool.workers.values()],
    }


async def add_worker(state: State, body: Any) -> dict:
    ref = parse_body(WorkerRef, body)
    worker = await state.pool.add(ref.url)
    if (member := getattr(state, "member", None)) is not None:
        member.control.worker_added(worker.url)  # to the other processes
    return describe(worker)  # 201, as its route says


async def remove_worker(state: State, body: Any) -> dict:
    ref = parse_body(WorkerRef, body)
    worker = state.pool.remove(ref.url)
    if (member := getattr(state, "member", None)) is not None:
        member.control.worker_removed(worker.url)
    return describe(worker)  # 202: it goes once its requests are done
