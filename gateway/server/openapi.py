"""The gateway's OpenAPI document (`/openapi.json`, `/docs`), request bodies included, made
from the route table (`gateway.server.routes`).

The routes that read a JSON body do it themselves (HotRoutes, or `request_json` under the
app's limits), so FastAPI knows no body for them. The document is therefore made from stub
routes, one for each route of the table, whose parameter and return annotations are the
table's models; they are never called. Clients and the fuzz test
(`tests/e2e/gateway/test_fuzz.py`) read it.
"""

from __future__ import annotations

import inspect
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, PlainTextResponse

from gateway.server.routes import ROUTES, Route


def documented_routes(routes: tuple[Route, ...] = ROUTES) -> APIRouter:
    """A router of stubs describing `routes`: each body's model as the request body."""
    router = APIRouter()
    for route in routes:
        router.add_api_route(
            route.path,
            _stub(route),
            methods=[route.method],
            summary=route.summary,
            description=route.description or None,
            status_code=route.status,
            response_class=PlainTextResponse if route.text else JSONResponse,
        )
    return router


def _stub(route: Route) -> Any:
    def stub(**_: Any) -> Any:  # pragma: no cover - a description, never called
        raise NotImplementedError

    parameters = []
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    if route.body is not None:
        parameters.append(inspect.Parameter("body", kind, annotation=route.body))
    if route.params is not None:
        # FastAPI reads a name in the path as a path parameter, any other as a query one.
        for name, field in route.params.model_fields.items():
            default = inspect.Parameter.empty if field.is_required() else field.default
            parameters.append(
                inspect.Parameter(
                    name,
                    inspect.Parameter.KEYWORD_ONLY,
                    default=default,
                    annotation=field.annotation,
                )
            )
    returns = route.response or (str if route.text else dict)
    stub.__signature__ = inspect.Signature(parameters, return_annotation=returns)  # type: ignore[attr-defined]
    stub.__name__ = f"{route.method.lower()}_{route.path.strip('/').replace('/', '_')}"
    return stub


def install(app: FastAPI, routes: tuple[Route, ...] = ROUTES) -> None:
    """Serve the document of the route table in place of FastAPI's own."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = get_openapi(
                title=app.title, version=app.version, routes=documented_routes(routes).routes
            )
        return app.openapi_schema

    app.openapi = openapi
