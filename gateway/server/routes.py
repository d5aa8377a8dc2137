"""Every route of the gateway's API, declared once: its method and path, the model of its JSON
body, what serves it and how it is documented.

From this table come the FastAPI routes (`install`), the generation routes that `HotRoutes`
serves before FastAPI (`hot_handlers`), the OpenAPI document (`gateway.server.openapi`), the
admission and metrics route sets, and the fuzz test's list of operations: a route added here is
served, documented and fuzzed; one added anywhere else is none of these. (The playground's page
and files are not API routes: `gateway.playground` serves them, undocumented.)
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import State

from gateway.api.messages.protocol import CountTokensRequest, CountTokensResponse, MessagesRequest
from gateway.api.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    EmbeddingRequest,
    PreprocessRequest,
    PreprocessResponse,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
)
from gateway.api.responses.protocol import ResponsesRequest
from gateway.api.responses.retrieval import (
    InputItemsParams,
    ResponseRef,
    RetrieveParams,
)
from gateway.errors import GatewayError, error_body, parse_body
from gateway.observability.metrics import CONTENT_TYPE
from gateway.server import admin
from gateway.server.hot_routes import Handler, request_json

WAITING = (
    "no engine worker has answered yet: the gateway learns the model from the first worker "
    "that does; try again shortly"
)
PROCESSES_STARTING = "not every gateway process (--api-server-count) is ready yet"
VERSION = "0.1.0"
# What serves a route: the app's state (where the services live) and the parsed JSON body
# (None for a route without one); a dict is sent as JSON with the route's status.
Serve = Callable[[State, Any], Awaitable[Response | dict]]


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    serve: Serve
    summary: str
    body: Any = None  # the request body's model (None: the route reads no body)
    response: Any = None  # the response's model, for the document
    status: int = 200
    description: str = ""
    text: bool = False  # answers plain text, not JSON (for the document)
    # Served by HotRoutes, inside the middleware but before FastAPI's router, and counted by
    # admission: the generation routes, where FastAPI's ~50 us a request would show.
    hot: bool = False
    # The model of the path and query parameters of a route without a body, given to `serve`
    # in the body's place (`/v1/responses/{response_id}`: response_id, and ?stream=...).
    params: Any = None
    # A multipart form (the audio uploads): `serve` gets the request itself and reads it; a
    # generation route, so it takes an admission slot as the hot routes do.
    form: bool = False


def services(state: State) -> Any:
    """The app's services (`gateway.server.app.Services`), or a 503 while no worker has
    answered yet."""
    built = getattr(state, "services", None)
    if built is None:
        raise GatewayError(WAITING, 503)
    return built


async def _health(state: State, body: None) -> dict:
    return {"status": "ok"}


async def _ready(state: State, body: None) -> JSONResponse:
    if state.services is None:
        return JSONResponse(error_body(WAITING, 503), 503)
    member = getattr(state, "member", None)
    if member is not None and not member.all_ready():  # ready when every process is
        return JSONResponse(error_body(PROCESSES_STARTING, 503), 503)
    if state.pool.any_healthy():
        return JSONResponse({"status": "ready"})
    return JSONResponse(error_body("no healthy engine worker", 503), 503)


async def _version(state: State, body: None) -> dict:
    return {"version": VERSION}


async def _models(state: State, body: None) -> dict:
    model = {
        "id": state.model_name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "mmgate",
        "root": state.model_root,
    }
    return {"object": "list", "data": [model]}


async def _metrics(state: State, body: None) -> Response:
    return Response(state.metrics.exposition(), media_type=CONTENT_TYPE)


ROUTES: tuple[Route, ...] = (
    Route("GET", "/health", _health, "Liveness: the process answers"),
    Route("GET", "/ready", _ready, "Readiness: a worker has answered and one is healthy"),
    Route("GET", "/version", _version, "The gateway's version"),
    Route("GET", "/v1/models", _models, "The served model (OpenAI)"),
    Route("GET", "/metrics", _metrics, "Prometheus metrics", text=True),
    Route(
        "POST",
        "/v1/chat/completions",
        lambda state, body: services(state).chat.create(body),
        "Chat completion (OpenAI)",
        ChatCompletionRequest,
        hot=True,
    ),
    Route(
        "POST",
        "/v1/completions",
        lambda state, body: services(state).completions.create(body),
        "Text completion (OpenAI)",
        CompletionRequest,
        hot=True,
    ),
    Route(
        "POST",
        "/v1/embeddings",
        lambda state, body: services(state).embeddings.create(body),
        "Embeddings (OpenAI; pooling models)",
        EmbeddingRequest,
        hot=True,
    ),
    Route(
        "POST",
        "/v1/messages",
        lambda state, body: services(state).messages.create(body),
        "Message (Anthropic), streamed or not",
        MessagesRequest,
        hot=True,
    ),
    Route(
        "POST",
        "/v1/messages/count_tokens",
        lambda state, body: services(state).messages.count_tokens(body),
        "The input tokens of a Message request (Anthropic)",
        CountTokensRequest,
        CountTokensResponse,
    ),
    Route(
        "POST",
        "/tokenize",
        lambda state, body: services(state).tokenize.tokenize(body),
        "Tokenize a prompt or chat messages (vLLM)",
        TokenizeCompletionRequest | TokenizeChatRequest,
    ),
    Route(
        "POST",
        "/detokenize",
        lambda state, body: services(state).tokenize.detokenize(body),
        "Detokenize token ids (vLLM)",
        DetokenizeRequest,
    ),
    Route(
        "POST",
        "/v1/preprocess",
        lambda state, body: services(state).preprocess.preprocess(body),
        "What the gateway makes of each image of chat messages (mmgate)",
        PreprocessRequest,
        PreprocessResponse,
        description="Takes a chat request's prompt fields (`messages`, `mm_processor_kwargs`, "
        "`chat_template_kwargs`, ...) and preprocesses its images as /v1/chat/completions "
        "would, without generating: per image the processor family, decoded size, grid or tile "
        "counts, placeholder tokens and tensors. A bad image is a 400 naming it, as in chat.",
    ),
    Route(
        "POST",
        "/v1/responses",
        lambda state, body: services(state).responses.create(body),
        "Create a response (OpenAI Responses)",
        ResponsesRequest,
        hot=True,
    ),
    Route(
        "GET",
        "/v1/responses/{response_id}",
        lambda state, params: state.stored_responses.retrieve(params),
        "A stored response (OpenAI Responses)",
        params=RetrieveParams,
    ),
    Route(
        "DELETE",
        "/v1/responses/{response_id}",
        lambda state, params: state.stored_responses.delete(params),
        "Delete a stored response, stopping it if it runs in the background (OpenAI)",
        params=ResponseRef,
    ),
    Route(
        "GET",
        "/v1/responses/{response_id}/input_items",
        lambda state, params: state.stored_responses.input_items(params),
        "The input items of a stored response, a page at a time (OpenAI)",
        params=InputItemsParams,
    ),
    Route(
        "POST",
        "/v1/responses/{response_id}/cancel",
        lambda state, params: state.stored_responses.cancel(params),
        "Cancel a background response (OpenAI Responses)",
        params=ResponseRef,
    ),
    Route(
        "POST",
        "/v1/audio/transcriptions",
        lambda state, request: services(state).transcriptions.create(request),
        "Transcribe an uploaded audio file (OpenAI; Whisper-style models)",
        form=True,
        description="A multipart form as vLLM takes it: `file`, `model`, `language`, "
        "`prompt`, `response_format` (json, text, verbose_json), `temperature`, `stream`, ...",
    ),
    Route(
        "POST",
        "/v1/audio/translations",
        lambda state, request: services(state).translations.create(request),
        "Translate an uploaded audio file to English text (OpenAI; Whisper-style models)",
        form=True,
        description="A multipart form as vLLM takes it, as for /v1/audio/transcriptions.",
    ),
    Route("GET", "/admin/workers", admin.list_workers, "The engine workers and their state"),
    Route(
        "POST",
        "/admin/workers",
        admin.add_worker,
        "Add an engine worker",
        admin.WorkerRef,
        status=201,
    ),
    Route(
        "DELETE",
        "/admin/workers",
        admin.remove_worker,
        "Drain and remove an engine worker",
        admin.WorkerRef,
        status=202,
    ),
)


def hot_handlers(routes: tuple[Route, ...] = ROUTES) -> Mapping[str, Handler]:
    """The routes HotRoutes serves, by path."""
    return {route.path: route.serve for route in routes if route.hot}


def admitted_paths(routes: tuple[Route, ...] = ROUTES) -> set[str]:
    """The generation routes, which take an admission slot: the hot ones and the forms."""
    return {route.path for route in routes if route.hot or route.form}


def paths(routes: tuple[Route, ...] = ROUTES) -> set[str]:
    return {route.path for route in routes}


def without_admin(routes: tuple[Route, ...]) -> tuple[Route, ...]:
    """The table without /admin (off on a non-loopback bind with no admin key)."""
    return tuple(route for route in routes if not route.path.startswith("/admin"))


def install(app: FastAPI, routes: tuple[Route, ...] = ROUTES) -> None:
    """The table's other routes as FastAPI routes. They are left out of FastAPI's own document:
    `gateway.server.openapi` describes every route of the table, bodies included."""
    for route in routes:
        if not route.hot:
            app.add_api_route(
                route.path, _endpoint(route), methods=[route.method], include_in_schema=False
            )


def _endpoint(route: Route) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        body = await request_json(request) if route.body is not None else None
        if route.form:
            body = request
        if route.params is not None:
            body = parse_body(route.params, {**request.query_params, **request.path_params})
        reply = await route.serve(request.app.state, body)
        return JSONResponse(reply, route.status) if isinstance(reply, dict) else reply

    endpoint.__name__ = f"{route.method.lower()}_{route.path.strip('/').replace('/', '_')}"
    return endpoint
