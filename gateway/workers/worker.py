"""One engine worker seen from the gateway: its facts, its health, and calls to it over gRPC."""

from __future__ import annotations

import ipaddress
import json
import logging
import re
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field

import grpc

from gateway.errors import GatewayError
from gateway.transport import StreamChannel
from gateway.workers.health import CircuitBreaker, HealthGate
from gateway.workers.send_once import ItemMirror
from gateway.workers.tls import PLAIN_SCHEME, TLS_SCHEME, WorkerTls, is_tls
from multimodal.pipeline import PixelEncoding
from multimodal.wire import Piece
from protos import common_pb2, extensions
from protos import vllm_engine_pb2 as pb
from protos import vllm_engine_pb2_grpc as pb_grpc

log = logging.getLogger("mmgate.gateway")
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_permit_without_calls", 1),
    # A worker that was down (a pod restarting, an engine loading) is dialled again within 5 s
    # of coming back, not after gRPC's default backoff of up to 2 minutes.
    ("grpc.max_reconnect_backoff_ms", 5_000),
]
GENERATE_PATH = "/vllm.grpc.engine.VllmEngine/Generate"
# Which client streams Generate: our event-loop HTTP/2 client (gateway.transport), or grpc.aio.
STREAM_CLIENTS = ("mmgate", "grpcio")


@dataclass
class WorkerFacts:
    """What GetModelInfo and GetServerInfo told us; fixed for the worker's lifetime."""

    model_path: str
    served_model_name: str
    max_context_length: int
    vocab_size: int
    eos_token_ids: list[int]
    supports_vision: bool
    is_generation: bool
    pixels: PixelEncoding
    sampling_defaults: dict = field(default_factory=dict)
    # Per-prompt media limits (--limit-mm-per-prompt) by modality; empty when not advertised.
    # smg-grpc-servicer does not enforce them on preprocessed input: whoever preprocesses must.
    mm_item_limits: dict[str, int] = field(default_factory=dict)
    # URL schemes the worker fetches for `media_refs` (GetServerInfo.mm_media_ref_schemes);
    # empty when it processes no media itself (mm_processor off).
    media_ref_schemes: frozenset[str] = frozenset()
    # The worker's /dev/shm identity (<boot_id>:<st_dev>; "" when not advertised): tensors go
    # through /dev/shm under --multimodal-tensor-transport auto when it equals the gateway's.
    shm_namespace_id: str = ""
    # mmgate's wire additions the worker advertised (protos/extensions.py); none from SMG's
    # upstream servicer.
    extensions: frozenset[str] = frozenset()
    # Its item cache (send each item once: gateway/workers/send_once.py), if it keeps one.
    item_cache: extensions.ItemCacheInfo | None = None

    @property
    def takes_media_refs(self) -> bool:
        """Whether the worker preprocesses media the gateway sends as data: URLs."""
        return "data" in self.media_ref_schemes

    @property
    def enforces_thinking_budget(self) -> bool:
        """Whether the worker takes a thinking budget and its engine enforces it."""
        return extensions.ENFORCES_THINKING_BUDGET in self.extensions

    @property
    def takes_audio_mm_inputs(self) -> bool:
        """Whether the worker takes audio clips the gateway preprocessed (mmgate's does; SMG's
        upstream servicer does not)."""
        return extensions.TAKES_AUDIO_MM_INPUTS in self.extensions

    @property
    def takes_allowed_token_ids(self) -> bool:
        """Whether the worker restricts sampling to the token ids a call's metadata lists."""
        return extensions.TAKES_ALLOWED_TOKEN_IDS in self.extensions


def parse_item_limits(label: str) -> dict[str, int]:
    """GetServerInfo.mm_item_limits, `image=4,video=1`, to {"image": 4, "video": 1}."""
    limits = {}
    for pair in filter(None, label.split(",")):
        modality, _, count = pair.partition("=")
        if count.strip().isdigit():
            limits[modality.strip()] = int(count)
    return limits


def parse_schemes(mm_processor: str, schemes: str) -> frozenset[str]:
    """GetServerInfo's `mm_media_ref_schemes`, `http,https,data`, as a set; empty unless the
    worker's `mm_processor` is on."""
    if not mm_processor:
        return frozenset()
    return frozenset(s.strip().lower() for s in schemes.split(",") if s.strip())


def parse_address(url: str) -> str:
    """grpc://host:port, grpcs://host:port (TLS) or host:port (plain) to the host:port gRPC
    dials: a DNS name or an IP address (IPv6 in brackets) and a port number."""
    address = url.removeprefix(TLS_SCHEME) if is_tls(url) else url.removeprefix(PLAIN_SCHEME)
    host, _, port = address.rpartition(":")
    if not (port.isascii() and port.isdigit() and 0 < int(port) < 65536 and _is_host(host)):
        message = (
            f"worker address must look like grpc://HOST:PORT or grpcs://HOST:PORT, got {url!r}"
        )
        raise GatewayError(message, 400, "url")
    return address


_HOSTNAME = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*\.?")


def _is_host(host: str) -> bool:
    if host.startswith("[") and host.endswith("]"):
        try:
            return ipaddress.ip_address(host[1:-1]).version == 6
        except ValueError:
            return False
    return len(host) <= 253 and _HOSTNAME.fullmatch(host) is not None


# gRPC codes that say the worker (not the request) is at fault: they count against its
# circuit breaker, and before the first token the request is retried on another worker.
WORKER_FAULTS = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.DATA_LOSS,
    }
)


class Worker:
    def __init__(
        self,
        url: str,
        health: HealthGate | None = None,
        breaker: CircuitBreaker | None = None,
        stream_client: str = "mmgate",
        sender: str | None = None,
        tls: WorkerTls | None = None,
        server_name: str | None = None,
    ) -> None:
        """`sender`: this gateway process's id in the worker's item cache (WorkerPool's; a
        fresh one when None). For a grpcs:// `url`: `tls`, the CAs and client certificate
        (None: the system's CAs, no client certificate); `server_name`, the name its
        certificate must carry (default: the URL's host; a --worker-dns member dialled by IP
        address passes the DNS name)."""
        if stream_client not in STREAM_CLIENTS:
            raise ValueError(
                f"stream client must be one of {STREAM_CLIENTS}, got {stream_client!r}"
            )
        self.url = url
        self.address = parse_address(url)
        self.tls = is_tls(url)
        host = self.address.rpartition(":")[0].strip("[]")
        if self.tls:
            settings = tls or WorkerTls()
            options = list(CHANNEL_OPTIONS)
            if server_name and server_name != host:  # the name checked, and sent in SNI
                options.append(("grpc.ssl_target_name_override", server_name))
            self._channel = grpc.aio.secure_channel(
                self.address, settings.grpc_credentials(), options=options
            )
            stream_tls = (settings.ssl_context(), server_name or host)
        else:
            self._channel = grpc.aio.insecure_channel(self.address, options=CHANNEL_OPTIONS)
            stream_tls = None
        self.stub = pb_grpc.VllmEngineStub(self._channel)
        # Generate taking the request already serialized.
        self._generate_raw = self._channel.unary_stream(
            GENERATE_PATH, response_deserializer=pb.GenerateResponse.FromString
        )
        self._streams = (
            StreamChannel(self.address, tls=stream_tls) if stream_client == "mmgate" else None
        )
        self.facts: WorkerFacts | None = None
        self.health = health or HealthGate()
        self.breaker = breaker or CircuitBreaker()
        self.in_flight = 0  # gRPC calls open on it
        self.assigned = 0  # gateway requests routed to it and not finished
        self.draining = False
        self.requests = 0
        self.unreachable = False  # its last connection attempt failed (logged once)
        self.refused = ""  # why it is not used: it serves another model than the gateway's
        # What its item cache holds for us (None: it keeps none); a new one for each life of
        # it, or when it dropped our partition.
        self.sender = sender or uuid.uuid4().hex
        self.mm_items: ItemMirror | None = None

    def reset_items(self, cache: extensions.ItemCacheInfo | None) -> None:
        """Mirror this life of the worker's item cache (a restarted worker's is empty)."""
        if cache is None:
            self.mm_items = None
        elif self.mm_items is None or self.mm_items.instance != cache.instance:
            self.mm_items = ItemMirror(cache.max_bytes, cache.instance, self.sender)

    @property
    def healthy(self) -> bool:
        return self.health.healthy

    @property
    def eligible(self) -> bool:
        return (
            self.healthy
            and self.facts is not None
            and not self.refused
            and not self.draining
            and self.breaker.allows()
        )

    async def connect(self, timeout: float = 10.0) -> WorkerFacts:
        model = await self.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=timeout)
        info = self.stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=timeout)
        server = await info
        trailing = await info.trailing_metadata()
        defaults = model.default_sampling_params_json
        self.facts = WorkerFacts(
            model_path=model.model_path,
            served_model_name=model.served_model_name,
            max_context_length=model.max_context_length,
            vocab_size=model.vocab_size,
            eos_token_ids=list(model.eos_token_ids),
            supports_vision=model.supports_vision,
            is_generation=model.is_generation,
            pixels=PixelEncoding.for_engine(
                server.mm_device_do_normalize, server.multimodal_encoder_dtype
            ),
            sampling_defaults=json.loads(defaults) if defaults else {},
            mm_item_limits=parse_item_limits(server.mm_item_limits),
            media_ref_schemes=parse_schemes(server.mm_processor, server.mm_media_ref_schemes),
            shm_namespace_id=server.shm_namespace_id,
            extensions=extensions.capabilities(trailing),
            item_cache=extensions.item_cache_info(trailing),
        )
        self.reset_items(self.facts.item_cache)
        self.health.force(True)
        return self.facts

    async def check_health(self, timeout: float = 5.0) -> bool:
        try:
            reply = await self.stub.HealthCheck(pb.HealthCheckRequest(), timeout=timeout)
            passed, why = reply.healthy, reply.message or "reported unhealthy"
        except grpc.aio.AioRpcError as error:
            passed, why = False, error.code().name
        if self.health.record(passed):
            state = "healthy again" if passed else f"unhealthy ({why})"
            log.warning("worker %s is %s", self.url, state)
        return self.healthy

    def record_call(self, error: grpc.aio.AioRpcError | None) -> None:
        """A finished call's outcome for the circuit breaker; request errors do not count."""
        if error is None:
            self.breaker.record(True)
        elif error.code() in WORKER_FAULTS:
            self.breaker.record(False)

    async def generate(
        self,
        request: pb.GenerateRequest,
        tail: Sequence[Piece] = (),
        metadata: Sequence[tuple[str, str]] = (),
    ) -> AsyncIterator[pb.GenerateResponse]:
        """Stream the worker's responses; a caller that stops iterating cancels the call,
        which makes the worker abort the request in its engine. `tail`: more fields of the
        request, already serialized (sent after the request's own, without being copied);
        `metadata`: custom gRPC metadata (a trace's context)."""
        self.in_flight += 1
        payload = [request.SerializeToString(), *tail]
        try:
            if self._streams is None:
                call = self._generate_grpcio(b"".join(payload), metadata)
                async with aclosing(call) as responses:
                    async for response in responses:
                        yield response
                return
            messages = self._streams.stream(GENERATE_PATH, payload, metadata)
            async with aclosing(messages):
                async for message in messages:
                    yield pb.GenerateResponse.FromString(message)
        finally:
            self.in_flight -= 1

    async def _generate_grpcio(
        self, request: bytes, metadata: Sequence[tuple[str, str]]
    ) -> AsyncIterator[pb.GenerateResponse]:
        call = self._generate_raw(request, metadata=tuple(metadata) or None)
        try:
            async for response in call:
                yield response
        finally:
            call.cancel()

    async def embed(self, request: pb.EmbedRequest, timeout: float = 300.0) -> pb.EmbedResponse:
        self.in_flight += 1
        try:
            reply = await self.stub.Embed(request, timeout=timeout)
        except grpc.aio.AioRpcError as error:
            self.record_call(error)
            raise
        finally:
            self.in_flight -= 1
        self.record_call(None)
        return reply

    async def tokenizer_bundle(self, timeout: float = 60.0) -> tuple[bytes, str]:
        """The worker's tokenizer files as a zip, and the sha256 it sent with the last chunk."""
        call = self.stub.GetTokenizer(common_pb2.GetTokenizerRequest(), timeout=timeout)
        chunks = [c async for c in call]
        return b"".join(c.data for c in chunks), chunks[-1].sha256 if chunks else ""

    async def close(self) -> None:
        if self._streams is not None:
            await self._streams.close()
        await self._channel.close()
