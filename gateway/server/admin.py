"""/admin/workers: see, add and remove engine workers at runtime.

GET lists every worker with its state; POST {"url": "grpc://HOST:PORT"} adds one (it gets
traffic once it answers; grpcs://HOST:PORT: over TLS, with the --ca-cert-paths settings);
DELETE {"url": ...} stops routing to it and drops it once its requests have finished.
Guarded by the API key when one is set. With several gateway processes
(`--api-server-count`), the process that took the change passes it to the others through the
supervisor (processes/control.py); GET shows the whole gateway's view (processes' counts
summed, a worker healthy when every process finds it so).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from starlette.datastructures import State

from gateway.errors import parse_body
from gateway.workers.health import STATE_VALUES
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
    workers = [describe(w) for w in state.pool.workers.values()]
    if getattr(state, "member", None) is not None:
        _gateway_wide(workers, state.metrics.gateway_wide())
    return {"policy": state.pool.router.policy, "workers": workers}


# Several processes: the per-worker state as the whole gateway sees it, merged as /metrics
# merges it (observability/process_metrics.py; other processes' views up to 0.25 s old).
GATEWAY_WIDE = {
    "healthy": ("mmgate_worker_healthy", bool),  # by every process
    "draining": ("mmgate_worker_draining", bool),
    "circuit": ("mmgate_worker_circuit_state", lambda v: CIRCUIT_STATES[v]),  # the most open
    "assigned_requests": ("mmgate_worker_assigned_requests", int),  # summed
    "calls_in_flight": ("mmgate_worker_requests_in_flight", int),
    "requests_total": ("mmgate_worker_requests_total", int),
}
CIRCUIT_STATES = {value: state for state, value in STATE_VALUES.items()}


def _gateway_wide(workers: list[dict[str, Any]], samples: dict[str, dict]) -> None:
    for worker in workers:
        labels = (("worker", worker["url"]),)
        for key, (name, convert) in GATEWAY_WIDE.items():
            value = samples.get(name, {}).get(labels)
            if value is not None:
                worker[key] = convert(value)


async def add_worker(state: State, body: Any) -> dict:
    ref = parse_body(WorkerRef, body)
    worker = await state.pool.add(ref.url)
    if (member := getattr(state, "member", None)) is not None:
        member.control.worker_added(worker.url)  # to the other processes
    return _described(state, worker)  # 201, as its route says


async def remove_worker(state: State, body: Any) -> dict:
    ref = parse_body(WorkerRef, body)
    worker = state.pool.remove(ref.url)
    if (member := getattr(state, "member", None)) is not None:
        member.control.worker_removed(worker.url)
    return _described(state, worker)  # 202: it goes once its requests are done


def _described(state: State, worker: Worker) -> dict[str, Any]:
    described = [describe(worker)]
    if getattr(state, "member", None) is not None:
        _gateway_wide(described, state.metrics.gateway_wide())
    return described[0]
