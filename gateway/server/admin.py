"""/admin/workers: see, add and remove engine workers at runtime.

GET lists every worker with its state; POST {"url": "grpc://HOST:PORT"} adds one (it gets
traffic once it answers); DELETE {"url": ...} stops routing to it and drops it once its requests
have finished. Guarded by the API key when one is set.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from gateway.errors import parse_body
from gateway.server.hot_routes import request_json
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


def admin_routes() -> APIRouter:
    router = APIRouter(prefix="/admin")

    @router.get("/workers")
    async def list_workers(request: Request) -> dict:
        pool = request.app.state.pool
        return {
            "policy": pool.router.policy,
            "workers": [describe(w) for w in pool.workers.values()],
        }

    @router.post("/workers")
    async def add_worker(request: Request) -> JSONResponse:
        ref = parse_body(WorkerRef, await request_json(request))
        worker = await request.app.state.pool.add(ref.url)
        return JSONResponse(describe(worker), 201)

    @router.delete("/workers")
    async def remove_worker(request: Request) -> JSONResponse:
        ref = parse_body(WorkerRef, await request_json(request))
        worker = request.app.state.pool.remove(ref.url)
        return JSONResponse(describe(worker), 202)

    return router
