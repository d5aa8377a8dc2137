"""The HTTP routes; the work is done by the services they call."""

from __future__ import annotations

import json
import logging
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp
from tokenizers import Tokenizer

from gateway.admin import admin_routes
from gateway.admission import Admission
from gateway.chat import ChatRenderer
from gateway.errors import GatewayError, error_body, error_response
from gateway.hot_routes import Handler, HotRoutes, parse_json
from gateway.metrics import CONTENT_TYPE, GatewayMetrics
from gateway.middleware import AdmissionMiddleware, ApiKeyMiddleware, RequestMiddleware
from gateway.model_files import is_model_dir, unpack_bundle
from gateway.pool import PoolOptions, WorkerPool
from gateway.serving_chat import ChatService
from gateway.serving_completion import CompletionService
from gateway.serving_embedding import EmbeddingService
from gateway.serving_tokenize import TokenizeService
from multimodal.fetch import create_http_client
from multimodal.media import MediaPolicy
from multimodal.registry import UnsupportedModel, processor_for

VERSION = "0.1.0"
# Served by HotRoutes (the parsed JSON body straight to the service), not by FastAPI's router.
GENERATION_ROUTES: dict[str, Handler] = {
    "/v1/chat/completions": lambda state, body: state.chat.create(body),
    "/v1/completions": lambda state, body: state.completions.create(body),
    "/v1/embeddings": lambda state, body: state.embeddings.create(body),
}
log = logging.getLogger("mmgate.gateway")


@dataclass
class CorsConfig:
    """vLLM's --allowed-origins/methods/headers and --allow-credentials; no origins by default."""

    allowed_origins: list[str] = field(default_factory=list)
    allowed_methods: list[str] = field(default_factory=lambda: ["*"])
    allowed_headers: list[str] = field(default_factory=lambda: ["*"])
    allow_credentials: bool = False


@dataclass
class AdmissionConfig:
    """At most max_in_flight generation requests at once, max_queue waiting (429 beyond),
    each waiting at most queue_timeout seconds (503 after)."""

    max_in_flight: int = 256
    max_queue: int = 1024
    queue_timeout: float = 30.0


@dataclass
class GatewayConfig:
    model: Path  # a local model directory, or a name whose files come from the workers
    workers: list[str]
    served_model_name: str | None = None
    chat_template: str | None = None
    media_policy: MediaPolicy = field(default_factory=MediaPolicy)
    api_keys: list[str] = field(default_factory=list)
    cors: CorsConfig = field(default_factory=CorsConfig)
    worker_dns: list[str] = field(default_factory=list)
    pool: PoolOptions = field(default_factory=PoolOptions)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)


def create_app(config: GatewayConfig) -> ASGIApp:
    metrics = GatewayMetrics()
    limits = config.admission
    admission = Admission(limits.max_in_flight, limits.max_queue, limits.queue_timeout)
    metrics.watch(admission.collector())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        pool = WorkerPool(config.workers, config.pool, config.worker_dns, metrics)
        facts = await pool.start()
        metrics.watch(pool.collector())
        model_dir = await _model_dir(config.model, pool)
        http = create_http_client(config.media_policy)
        app.state.pool = pool
        _services(app, config, model_dir, pool, facts, http, metrics)
        yield
        await http.aclose()
        await pool.close()

    app = FastAPI(title="mmgate", version=VERSION, lifespan=lifespan)

    _routes(app, config, metrics)
    app.include_router(admin_routes())
    return _middleware(app, config, metrics, admission)


def _routes(app: FastAPI, config: GatewayConfig, metrics: GatewayMetrics) -> None:
    @app.exception_handler(GatewayError)
    async def _gateway_error(request: Request, error: GatewayError) -> JSONResponse:
        return error_response(error)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/ready")
    async def ready(request: Request) -> JSONResponse:
        if request.app.state.pool.any_healthy():
            return JSONResponse({"status": "ready"})
        return JSONResponse(error_body("no healthy engine worker", 503), 503)

    @app.get("/version")
    async def version() -> dict:
        return {"version": VERSION}

    @app.get("/v1/models")
    async def models(request: Request) -> dict:
        name = request.app.state.chat.model_name
        return {
            "object": "list",
            "data": [
                {
                    "id": name,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "mmgate",
                    "root": str(config.model),
                }
            ],
        }

    @app.post("/tokenize")
    async def tokenize(request: Request):
        return await request.app.state.tokenize.tokenize(await _json(request))

    @app.post("/detokenize")
    async def detokenize(request: Request):
        return await request.app.state.tokenize.detokenize(await _json(request))

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.exposition(), media_type=CONTENT_TYPE)


async def _model_dir(model: Path, pool: WorkerPool) -> Path:
    if is_model_dir(model):
        return model
    log.info("%s is not a local model directory: asking the workers for its files", model)
    return unpack_bundle(*await pool.tokenizer_bundle())


def _services(app: FastAPI, config: GatewayConfig, model_dir: Path, pool, facts, http, metrics):
    clean_up = _clean_up_spaces(model_dir)
    chat = ChatService(
        model_name=config.served_model_name or str(config.model),
        renderer=ChatRenderer.from_model_dir(model_dir, config.chat_template),
        tokenizer=Tokenizer.from_file(str(model_dir / "tokenizer.json")),
        processor=_image_processor(model_dir),
        pool=pool,
        media_policy=config.media_policy,
        http_client=http,
        metrics=metrics,
        clean_up_spaces=clean_up,
    )
    app.state.chat = chat
    app.state.completions = CompletionService(
        chat.model_name, chat.tokenizer, chat.added, pool, metrics, clean_up
    )
    app.state.embeddings = EmbeddingService(chat.model_name, chat.tokenizer, pool)
    app.state.tokenize = TokenizeService(chat, facts.max_context_length, clean_up)


def _middleware(
    app: FastAPI, config: GatewayConfig, metrics: GatewayMetrics, admission: Admission
) -> ASGIApp:
    """Around the FastAPI app, outermost last: request ids and logs see everything, CORS
    answers preflights before the API key is asked for, and only authorized requests take
    admission slots. The generation routes are served inside all of them by HotRoutes and
    never enter FastAPI (its router, exception and error layers cost ~50 us a request)."""
    stack: ASGIApp = HotRoutes(app, GENERATION_ROUTES, app.state)
    stack = AdmissionMiddleware(stack, admission, metrics, GENERATION_ROUTES)
    if config.api_keys:
        stack = ApiKeyMiddleware(stack, config.api_keys)
    if config.cors.allowed_origins:
        stack = CORSMiddleware(
            stack,
            allow_origins=config.cors.allowed_origins,
            allow_methods=config.cors.allowed_methods,
            allow_headers=config.cors.allowed_headers,
            allow_credentials=config.cors.allow_credentials,
            expose_headers=["X-Request-Id"],
        )
    routes = {route.path for route in app.routes} | GENERATION_ROUTES.keys()
    return RequestMiddleware(stack, metrics, routes)


def _clean_up_spaces(model: Path) -> bool:
    try:
        config = json.loads((model / "tokenizer_config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return bool(config.get("clean_up_tokenization_spaces", False))


async def _json(request: Request) -> object:
    return parse_json(await request.body())


def _image_processor(model: Path):
    try:
        return processor_for(model)
    except UnsupportedModel:
        return None
