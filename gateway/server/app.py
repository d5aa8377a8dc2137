"""The HTTP app: routes, the services behind them, and the middleware around them.

The gateway starts whether or not a worker answers (in Kubernetes it usually starts before
the engines, which take minutes to load a model). The model's files are loaded once (from
`--model`, or from a worker's bundle) and every service built on them as soon as the first
worker answers, at start or later; until then `/health` is 200, `/ready` 503, and the API
routes answer 503 at once. The generation routes are served by `HotRoutes` inside the
middleware; the others by FastAPI.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from starlette.datastructures import State
from starlette.types import ASGIApp

from gateway.api.audio.form import AudioLimits
from gateway.api.audio.service import SpeechToTextService
from gateway.api.chat import ChatService
from gateway.api.completions import CompletionService
from gateway.api.embeddings import EmbeddingService
from gateway.api.messages.service import MessagesService
from gateway.api.preprocess import PreprocessService
from gateway.api.responses.background import BackgroundRuns
from gateway.api.responses.memory_store import InMemoryResponseStore
from gateway.api.responses.retrieval import StoredResponses
from gateway.api.responses.service import ResponsesService
from gateway.api.responses.sqlite_store import SqliteResponseStore
from gateway.api.tokenize import TokenizeService
from gateway.errors import MmgateError, error_response
from gateway.observability.metrics import GatewayMetrics, MediaCacheCollector
from gateway.observability.tracing import configure as configure_tracing
from gateway.playground.routes import playground_routes
from gateway.ratelimit.callers import key_callers
from gateway.ratelimit.limiter import RateLimiter
from gateway.render.bundle import unpack_bundle
from gateway.render.model_files import ModelFiles, is_model_dir
from gateway.render.prompt import PromptBuilder
from gateway.render.renderer import ChatRenderer
from gateway.render.worker_media import fallback_placeholders
from gateway.server.admission import Admission
from gateway.server.config import GatewayConfig
from gateway.server.hot_routes import HotRoutes
from gateway.server.middleware import (
    AdmissionMiddleware,
    ApiKeyMiddleware,
    RequestMiddleware,
    TracingMiddleware,
)
from gateway.server.openapi import install as install_openapi
from gateway.server.processes.member import Member
from gateway.server.processes.shared import SharedAdmission
from gateway.server.rate_limit import RateLimitMiddleware
from gateway.server.routes import ROUTES, VERSION, admitted_paths, hot_handlers, without_admin
from gateway.server.routes import install as install_routes
from gateway.stream.logprobs import TokenTexts
from gateway.workers.pool import WorkerPool
from gateway.workers.tensor_transport import TensorTransport
from gateway.workers.worker import WorkerFacts
from multimodal.fetch import create_http_client
from multimodal.media_cache import MediaCache
from multimodal.registry import processors_for

RETRY_BUILD_SECONDS = 5.0
log = logging.getLogger("mmgate.gateway")


@dataclass(frozen=True)
class Services:
    """What serves the API routes, built on the model's files once a worker has answered."""

    chat: ChatService
    completions: CompletionService
    embeddings: EmbeddingService
    tokenize: TokenizeService
    preprocess: PreprocessService
    responses: ResponsesService
    messages: MessagesService
    transcriptions: SpeechToTextService
    translations: SpeechToTextService


def create_app(config: GatewayConfig, member: Member | None = None) -> ASGIApp:
    """`member`: this process's part in a multi-process gateway (`--api-server-count`)."""
    configure_tracing(config.otlp_traces_endpoint)
    metrics = GatewayMetrics() if member is None else member.metrics()
    model_name = config.served_model_name or str(config.model)
    limits = config.admission
    admission: Admission | SharedAdmission
    if member is None:
        admission = Admission(limits.max_in_flight, limits.max_queue, limits.queue_timeout)
    else:
        admission = member.admission(limits)
    metrics.watch(admission.collector(), gateway_wide=True)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        pool = WorkerPool(config.workers, config.pool, config.worker_dns, metrics)
        app.state.pool, app.state.services = pool, None
        http = create_http_client(config.media_policy)
        await pool.start()
        metrics.watch(pool.collector())
        if pool.model is not None:
            app.state.services = await _build(config, pool, pool.model, http, metrics, app.state)
        else:
            urls = ", ".join([*pool.workers, *config.worker_dns])
            log.warning("no worker answered yet (%s): answering 503 until one does", urls)
        waiting = asyncio.create_task(_build_when_known(app, config, pool, http, metrics))
        if member is not None:
            member.attach(app.state, pool, metrics)
        yield
        if member is not None:
            await member.detach()
        await app.state.background.close()
        if isinstance(store, SqliteResponseStore):  # (after the runs that write to it)
            await store.close()
        waiting.cancel()
        with suppress(asyncio.CancelledError):
            await waiting
        await http.aclose()
        await pool.close()

    app = FastAPI(title="mmgate", version=VERSION, lifespan=lifespan)

    app.state.model_name, app.state.model_root = model_name, str(config.model)
    app.state.member = member
    app.state.limits, app.state.metrics = config.limits, metrics
    # The response store outlives the services (rebuilt when the model's files change).
    # Several processes share one store: a response is found whichever process took it.
    store: InMemoryResponseStore | SqliteResponseStore
    if member is None:
        store = InMemoryResponseStore(config.responses_store, metrics)
    else:
        store = member.response_store(config.responses_store, metrics)
    app.state.response_store = store
    app.state.background = BackgroundRuns(admission, None if member is None else store)
    app.state.stored_responses = StoredResponses(app.state.response_store, app.state.background)
    # The media cache lives with the processors (a new one when the model's files change: an
    # item's hash covers the request's settings, not every family's whole preprocessor config);
    # /metrics reads the current one.
    app.state.media_cache = None
    metrics.watch(MediaCacheCollector(lambda: app.state.media_cache))
    _exception_handlers(app)
    # /admin off: its routes are not there at all, so neither served nor documented
    routes = ROUTES if config.admin_enabled else without_admin(ROUTES)
    install_routes(app, routes)
    if config.playground:
        app.include_router(playground_routes())
    install_openapi(app, routes)
    return _middleware(app, config, metrics, admission)


def _exception_handlers(app: FastAPI) -> None:
    @app.exception_handler(MmgateError)
    async def _mmgate_error(request: Request, error: MmgateError) -> JSONResponse:
        return error_response(error)


async def _build_when_known(
    app: FastAPI, config: GatewayConfig, pool: WorkerPool, http, metrics: GatewayMetrics
) -> None:
    """The services, once the first worker has answered; retried while that fails (a
    tokenizer bundle that does not come, say)."""
    while app.state.services is None:
        await pool.model_known.wait()
        try:
            app.state.services = await _build(config, pool, pool.model, http, metrics, app.state)
        except Exception:  # noqa: BLE001 - logged; the gateway keeps answering 503 meanwhile
            log.exception("the model's files could not be loaded; trying again")
            await asyncio.sleep(RETRY_BUILD_SECONDS)
    log.info("ready: serving %s", app.state.model_name)


async def _build(
    config: GatewayConfig,
    pool: WorkerPool,
    facts: WorkerFacts,
    http,
    metrics: GatewayMetrics,
    state: State,
) -> Services:
    """`state`: the app's, holding what outlives the services (the response store and the
    background runs)."""
    model_dir = await _model_dir(config.model, pool)
    return _services(config, model_dir, pool, facts, http, metrics, state)


async def _model_dir(model: Path, pool: WorkerPool) -> Path:
    if is_model_dir(model):
        return model
    log.info("%s is not a local model directory: asking the workers for its files", model)
    return unpack_bundle(*await pool.tokenizer_bundle())


def _services(
    config: GatewayConfig, model_dir: Path, pool, facts, http, metrics, state: State
) -> Services:
    files = ModelFiles.load(model_dir)
    processors = processors_for(files)
    placeholders = processors.placeholders
    if facts.supports_vision:
        # Media without a processor here goes to a worker: the prompt gets what vLLM writes
        # for them.
        placeholders = {
            **fallback_placeholders(files.config.get("architectures") or ()),
            **placeholders,
        }
        missing = [m for m in placeholders if m not in processors.by_modality]
        if missing:
            _log_fallback(files.config.get("model_type"), missing, config.mm_processing, pool)
    renderer = ChatRenderer(files, placeholders, chat_template=config.chat_template)
    state.media_cache = MediaCache.from_gib(config.mm_processor_cache_gb)
    prompts = PromptBuilder(
        renderer,
        processors,
        config.media_policy,
        http,
        metrics,
        config.mm_processing,
        config.max_concurrent_videos,
        config.max_mm_message_bytes,
        config.trust_request_mm_kwargs,
        TensorTransport(config.tensor_transport, config.shm_min_bytes, metrics),
        state.media_cache,
    )
    token_texts = TokenTexts(files.tokenizer, files.clean_up_spaces)
    name = config.served_model_name or str(config.model)
    limits = AudioLimits.from_policy(config.media_policy)
    parsing = config.parsing.for_model(files.config.get("model_type"))
    chat = ChatService(name, files, prompts, pool, metrics, token_texts, parsing)
    return Services(
        chat=chat,
        completions=CompletionService(name, files, pool, metrics, token_texts),
        embeddings=EmbeddingService(name, files.tokenizer, pool),
        tokenize=TokenizeService(name, files, prompts, facts.max_context_length),
        preprocess=PreprocessService(name, prompts, facts),
        responses=ResponsesService(chat, state.response_store, state.background),
        messages=MessagesService(chat),
        transcriptions=SpeechToTextService(name, files, pool, metrics, "transcribe", limits),
        translations=SpeechToTextService(name, files, pool, metrics, "translate", limits),
    )


def _log_fallback(model_type: object, missing: list[str], mode: str, pool: WorkerPool) -> None:
    """`missing`: the modalities the model takes that the gateway has no processor for."""
    kinds = " or ".join(missing)
    if mode == "gateway":
        log.warning(
            "no %s processor here for model_type %r: those requests are refused "
            "(--mm-processing gateway)",
            kinds,
            model_type,
        )
        return
    offering = sum(w.facts is not None and w.facts.takes_media_refs for w in pool.workers.values())
    log.warning(
        "no %s processor here for model_type %r: the engine workers preprocess those items "
        "(%d of %d workers take media, started with --mm-processor inprocess)",
        kinds,
        model_type,
        offering,
        len(pool.workers),
    )


def _middleware(
    app: FastAPI,
    config: GatewayConfig,
    metrics: GatewayMetrics,
    admission: Admission | SharedAdmission,
) -> ASGIApp:
    """Around the FastAPI app, outermost last: request ids and logs see everything, CORS
    answers preflights before the API key is asked for, and only authorized requests the
    rate limits (if any) let through take admission slots. The generation routes are served
    inside all of them by HotRoutes and never enter FastAPI (its router, exception and error
    layers cost ~50 us a request)."""
    hot = hot_handlers()
    stack: ASGIApp = HotRoutes(app, hot, app.state, config.limits)
    stack = AdmissionMiddleware(stack, admission, metrics, admitted_paths())
    callers: list[str] = []
    if config.rate_limits is not None:
        limiter = RateLimiter(config.rate_limits, metrics=metrics)
        stack = RateLimitMiddleware(stack, limiter, admitted_paths())
        callers = key_callers(config.api_keys, config.api_key_labels)
    surfaces = config.surfaces()
    if surfaces.api or surfaces.admin != () or surfaces.metrics:
        stack = ApiKeyMiddleware(stack, config.api_keys, surfaces, callers)
    if config.cors.allowed_origins:
        stack = CORSMiddleware(
            stack,
            allow_origins=config.cors.allowed_origins,
            allow_methods=config.cors.allowed_methods,
            allow_headers=config.cors.allowed_headers,
            allow_credentials=config.cors.allow_credentials,
            expose_headers=["X-Request-Id"],
        )
    routes = {route.path for route in app.routes} | hot.keys()
    return RequestMiddleware(TracingMiddleware(stack, sorted(routes)), metrics, routes)
