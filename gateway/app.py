"""The HTTP routes; the work is done by the services they call."""

from __future__ import annotations

import json
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from tokenizers import Tokenizer

from gateway.chat import ChatRenderer
from gateway.errors import GatewayError, error_body, error_response
from gateway.pool import WorkerPool
from gateway.serving_chat import ChatService
from gateway.serving_completion import CompletionService
from gateway.serving_embedding import EmbeddingService
from multimodal.fetch import create_http_client
from multimodal.media import MediaPolicy
from multimodal.registry import UnsupportedModel, processor_for

VERSION = "0.1.0"


@dataclass
class GatewayConfig:
    model: Path
    workers: list[str]
    served_model_name: str | None = None
    chat_template: str | None = None
    media_policy: MediaPolicy = field(default_factory=MediaPolicy)


def create_app(config: GatewayConfig) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        pool = WorkerPool(config.workers)
        await pool.start()
        http = create_http_client(config.media_policy)
        app.state.pool = pool
        app.state.chat = ChatService(
            model_name=config.served_model_name or str(config.model),
            renderer=ChatRenderer.from_model_dir(config.model, config.chat_template),
            tokenizer=Tokenizer.from_file(str(config.model / "tokenizer.json")),
            processor=_image_processor(config.model),
            pool=pool,
            media_policy=config.media_policy,
            http_client=http,
        )
        chat = app.state.chat
        app.state.completions = CompletionService(chat.model_name, chat.tokenizer, chat.added, pool)
        app.state.embeddings = EmbeddingService(chat.model_name, chat.tokenizer, pool)
        yield
        await http.aclose()
        await pool.close()

    app = FastAPI(title="mmgate", version=VERSION, lifespan=lifespan)

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

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await request.app.state.chat.create(await _json(request))

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await request.app.state.completions.create(await _json(request))

    @app.post("/v1/embeddings")
    async def embeddings(request: Request):
        return await request.app.state.embeddings.create(await _json(request))

    return app


async def _json(request: Request) -> object:
    try:
        return await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise GatewayError("the request body is not valid JSON", 400) from None


def _image_processor(model: Path):
    try:
        return processor_for(model)
    except UnsupportedModel:
        return None
