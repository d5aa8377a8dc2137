"""/admin/workers: see, add and remove engine workers at runtime.

GET lists every worker with its state; POST {"url": "grpc://HOST:PORT"} adds one (it gets
traffic once it answers); DELETE {"url": ...} stops routing to it and drops it once its requests
have finished. Guarded by the API key when one is set.
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
        # Its item cache as the gateway mirrors it (send-once); null: it keeps none
        "mm_item_cache": _items(worker),
    }


def _items(worker: Worker) -> dict[str, Any] | None:
    mirror = getattr(worker, "mm_items", None)
    if mirror is None:
        return None
    return {"max_bytes": mirror.max_bytes, "bytes": mirror.used, "items": len(mirror.entries)}


async def list_workers(state: State, body: None) -> dict:
    return {
        "policy": state.pool.router.policy,
        "workers": [describe(w) for w in state.pool.workers.values()],
    }


async def add_worker(state: State, body: Any) -> dict:
    ref = parse_body(WorkerRef, body)
    return describe(await state.pool.add(ref.url))  # 201, as its route says


async def remove_worker(state: State, body: Any) -> dict:
    ref = parse_body(WorkerRef, body)
    return describe(state.pool.remove(ref.url))  # 202: it goes once its requests are done
