"""The gateway's OpenAPI document (`/openapi.json`, `/docs`), request bodies included.

The routes that read a JSON body do it themselves (the generation routes in `HotRoutes`,
/tokenize, /detokenize, /v1/preprocess and the admin routes with `request_json`), so FastAPI
knows no body for them. The stubs below exist only to describe those bodies with the models
the services validate them with; they are never called. Clients and the fuzz test
(`tests/e2e/gateway/test_fuzz.py`) read the schema.
"""

# No `from __future__ import annotations`: FastAPI reads the stubs' annotations as classes.

from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.openapi.utils import get_openapi

from gateway.api.embeddings import EmbeddingRequest
from gateway.api.preprocess import PreprocessRequest, PreprocessResponse
from gateway.api.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
)
from gateway.server.admin import WorkerRef

DOCUMENTED = APIRouter()


@DOCUMENTED.post("/v1/chat/completions", summary="Chat completion (OpenAI)")
def chat_completions(body: ChatCompletionRequest) -> dict:  # pragma: no cover - a description
    raise NotImplementedError


@DOCUMENTED.post("/v1/completions", summary="Text completion (OpenAI)")
def completions(body: CompletionRequest) -> dict:  # pragma: no cover - a description
    raise NotImplementedError


@DOCUMENTED.post("/v1/embeddings", summary="Embeddings (OpenAI; pooling models)")
def embeddings(body: EmbeddingRequest) -> dict:  # pragma: no cover - a description
    raise NotImplementedError


@DOCUMENTED.post("/tokenize", summary="Tokenize a prompt or chat messages (vLLM)")
def tokenize(
    body: TokenizeCompletionRequest | TokenizeChatRequest,
) -> dict:  # pragma: no cover - a description
    raise NotImplementedError


@DOCUMENTED.post("/detokenize", summary="Detokenize token ids (vLLM)")
def detokenize(body: DetokenizeRequest) -> dict:  # pragma: no cover - a description
    raise NotImplementedError


@DOCUMENTED.post(
    "/v1/preprocess",
    summary="What the gateway makes of each image of chat messages (mmgate)",
    description="Takes a chat request's prompt fields (`messages`, `mm_processor_kwargs`, "
    "`chat_template_kwargs`, ...) and preprocesses its images as /v1/chat/completions would, "
    "without generating: per image the processor family, decoded size, grid or tile counts, "
    "placeholder tokens and tensors. A bad image is a 400 naming it, as in chat.",
)
def preprocess(body: PreprocessRequest) -> PreprocessResponse:  # pragma: no cover
    raise NotImplementedError


@DOCUMENTED.post("/admin/workers", summary="Add an engine worker", status_code=201)
def add_worker(body: WorkerRef) -> dict:  # pragma: no cover - a description
    raise NotImplementedError


@DOCUMENTED.delete("/admin/workers", summary="Drain and remove an engine worker", status_code=202)
def remove_worker(body: WorkerRef) -> dict:  # pragma: no cover - a description
    raise NotImplementedError


def install(app: FastAPI) -> None:
    """Serve the document with the bodies above in place of the bodiless real routes."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            described = {(r.path, m) for r in DOCUMENTED.routes for m in r.methods}
            routes = [r for r in app.routes if not described & _path_methods(r)]
            app.openapi_schema = get_openapi(
                title=app.title,
                version=app.version,
                routes=[*routes, *DOCUMENTED.routes],
            )
        return app.openapi_schema

    app.openapi = openapi


def _path_methods(route: Any) -> set[tuple[str, str]]:
    return {(route.path, m) for m in getattr(route, "methods", None) or ()}
