"""Run the VllmEngine service: AsyncLLM, gRPC server, health, reflection, graceful drain."""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from engine_server.media_refs import MediaRefSettings, build_media_processor
from engine_server.mm_item_cache import DEFAULT_ITEM_SENDERS
from engine_server.reaper import start_reaper
from engine_server.servicer import EngineServicer
from engine_server.tls import ServerTls
from protos import vllm_engine_pb2, vllm_engine_pb2_grpc

log = logging.getLogger("mmgate.engine")
SERVICE_NAME = vllm_engine_pb2.DESCRIPTOR.services_by_name["VllmEngine"].full_name
SERVER_OPTIONS = [
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
    # A non-streaming Generate is silent while the engine decodes; client keepalive pings in
    # that window must not count as abuse and earn a GOAWAY that kills in-flight calls.
    ("grpc.http2.max_ping_strikes", 0),
    ("grpc.http2.min_ping_interval_without_data_ms", 10000),
    ("grpc.keepalive_permit_without_calls", True),
]


@dataclass
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 50051
    drain_timeout: float = 30.0
    media: MediaRefSettings = field(default_factory=MediaRefSettings)
    item_senders: int = DEFAULT_ITEM_SENDERS  # --mm-item-cache-senders
    tls: ServerTls | None = None  # None: plain text (h2c)


class EngineServer:
    """The gRPC server around one engine; `start` then `wait_closed`, or `stop` to drain."""

    def __init__(self, engine: Any, options: ServeOptions) -> None:
        self.engine = engine
        self.options = options
        media = build_media_processor(engine, options.media)
        self.servicer = EngineServicer(
            engine, media, options.media.source, item_senders=options.item_senders
        )
        self.health = health_aio.HealthServicer()
        self.server = grpc.aio.server(options=SERVER_OPTIONS)
        vllm_engine_pb2_grpc.add_VllmEngineServicer_to_server(self.servicer, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name)
        reflection.enable_server_reflection((*names, reflection.SERVICE_NAME), self.server)
        self.port = 0
        self._stopped = asyncio.Event()
        self._watch: asyncio.Task | None = None

    async def start(self) -> int:
        address = f"{self.options.host}:{self.options.port}"
        tls = self.options.tls
        if tls is None:
            self.port = self.server.add_insecure_port(address)
        else:
            self.port = self.server.add_secure_port(address, tls.credentials())
        if self.port == 0:
            raise OSError(f"cannot bind the gRPC server to {address}")
        await self.server.start()
        await self._set_health(health_pb2.HealthCheckResponse.SERVING)
        self._watch = asyncio.create_task(self._watch_engine())
        transport = "plain text (h2c)"
        if tls is not None:
            transport = "TLS, client certificate required" if tls.client_ca_path else "TLS"
        log.info("VllmEngine serving on %s:%d, %s", self.options.host, self.port, transport)
        return self.port

    async def stop(self) -> None:
        """Refuse new calls, let in-flight ones finish (up to the drain timeout), then exit."""
        if self.servicer.draining:
            return
        self.servicer.draining = True
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        log.info(
            "draining %d in-flight requests (up to %.0fs)",
            len(self.servicer.in_flight),
            self.options.drain_timeout,
        )
        await self.server.stop(grace=self.options.drain_timeout)
        if self._watch:
            self._watch.cancel()
        self._stopped.set()

    async def wait_closed(self) -> None:
        await self._stopped.wait()

    async def _set_health(self, status: int) -> None:
        for name in ("", SERVICE_NAME):
            await self.health.set(name, status)

    async def _watch_engine(self) -> None:
        # The standard health service must turn NOT_SERVING when the engine dies, so that
        # Kubernetes probes and routers stop sending work here.
        while not self.engine.errored:
            await asyncio.sleep(1.0)
        log.error("the engine died; reporting NOT_SERVING")
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)


async def serve(engine_args: Any, options: ServeOptions) -> None:
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    start_reaper()  # before AsyncLLM starts its EngineCore: nothing outlives this process
    engine = AsyncLLM.from_engine_args(engine_args, usage_context=UsageContext.OPENAI_API_SERVER)
    try:
        server = EngineServer(engine, options)
        await server.start()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: asyncio.ensure_future(server.stop()))
        await server.wait_closed()
    finally:
        engine.shutdown()
        log.info("engine stopped")
