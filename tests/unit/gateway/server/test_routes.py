"""One route table: what the app serves, what /openapi.json documents and what HotRoutes
takes all come from `gateway.server.routes.ROUTES`, so no route is half-registered."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.routing import APIRoute
from starlette.testclient import TestClient

from gateway.server.app import create_app
from gateway.server.config import GatewayConfig
from gateway.server.routes import ROUTES, hot_handlers

# FastAPI's own pages, and the playground's (a page, not an API: undocumented on purpose).
NOT_API = {"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc", "/", "/playground"}
NOT_API_PREFIX = "/playground/"


@pytest.fixture(scope="module")
def app():
    return create_app(GatewayConfig(model=Path("/no/model"), workers=[]))


@pytest.fixture(scope="module")
def document(app) -> dict:
    return TestClient(app).get("/openapi.json").json()


def _fastapi_app(app):
    while not hasattr(app, "router"):  # under our middleware
        app = app.app
    return app


def test_the_document_is_the_table(document):
    documented = {(m.upper(), p) for p, ops in document["paths"].items() for m in ops}
    assert documented == {(route.method, route.path) for route in ROUTES}


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: f"{r.method} {r.path}")
def test_each_body_is_documented_with_its_model(document, route):
    operation = document["paths"][route.path][route.method.lower()]
    assert operation["summary"] == route.summary
    assert str(route.status) in operation["responses"]
    if route.body is None:
        assert "requestBody" not in operation
        return
    schema = operation["requestBody"]["content"]["application/json"]["schema"]
    refs = [schema.get("$ref")] + [s.get("$ref") for s in schema.get("anyOf", ())]
    names = {ref.rsplit("/", 1)[1] for ref in refs if ref}
    models = getattr(route.body, "__args__", (route.body,))
    assert names == {model.__name__ for model in models}


def test_every_served_route_is_in_the_table(app):
    served = set()
    for route in _fastapi_app(app).routes:
        if not isinstance(route, APIRoute) or route.path in NOT_API:
            continue
        if not route.path.startswith(NOT_API_PREFIX):
            served |= {(method, route.path) for method in route.methods}
    table = {(r.method, r.path) for r in ROUTES if not r.hot}
    assert served == table


def test_the_hot_routes_are_the_generation_routes():
    assert set(hot_handlers()) == {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/responses",
        "/v1/messages",
    }


def test_metrics_and_traces_name_a_route_with_an_id_by_its_template():
    from gateway.server.middleware import RouteNames

    name = RouteNames([route.path for route in ROUTES])
    assert name("/v1/chat/completions") == "/v1/chat/completions"
    assert name("/v1/responses/resp_123") == "/v1/responses/{response_id}"
    assert name("/v1/responses/resp_1/input_items") == "/v1/responses/{response_id}/input_items"
    assert name("/v1/responses/resp_1/cancel") == "/v1/responses/{response_id}/cancel"
    # never the path itself: an unknown one is "other", whatever it holds
    assert name("/v1/responses/a/b") == "other"
    assert name("/v1/nothing") == "other"
