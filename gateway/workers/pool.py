"""The workers behind the gateway: routing, health, circuit breakers, retries, membership.

Workers come from `--worker` URLs, from DNS names re-resolved periodically (every address is a
worker, so a Kubernetes headless service can be followed), and from the admin endpoint. A worker
being removed stops getting new requests and is dropped once its requests have finished.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import grpc

from gateway.errors import GatewayError
from gateway.observability.metrics import GatewayMetrics, GaugesFrom
from gateway.workers.health import STATE_VALUES, CircuitBreaker, HealthGate
from gateway.workers.kv_index import KvEventIndex, follow_worker
from gateway.workers.routing import MmSpan, Router
from gateway.workers.tls import PLAIN_SCHEME, TLS_SCHEME, WorkerTls, is_tls
from gateway.workers.worker import Worker, WorkerFacts, parse_address
from multimodal.pipeline import PixelEncoding

log = logging.getLogger("mmgate.gateway")
Resolver = Callable[[str, int], Awaitable[list[str]]]
_leases: contextvars.ContextVar[list[Worker] | None] = contextvars.ContextVar(
    "mmgate_leases", default=None
)


NO_MEDIA_WORKER = (
    "this request's media are for the engine worker to preprocess (the gateway has no "
    "processor for this model, or runs with --mm-processing worker), but no healthy worker "
    "does: start the workers with --mm-processor inprocess"
)
NO_AUDIO_INPUTS_WORKER = (
    "this request's audio is for the gateway to preprocess (--mm-processing gateway), but no "
    "healthy engine worker takes preprocessed audio (mmgate engine does; SMG's servicer does "
    "not): use --mm-processing auto or worker with workers started with --mm-processor inprocess"
)
# vLLM's input processor's message for a budget its engine cannot enforce, then which
# workers can: mmgate's, whose engine runs a reasoning parser (SMG's servicer takes none).
NO_BUDGET_WORKER = (
    "thinking_token_budget is set but reasoning_config is not configured. Please set "
    "--reasoning-parser and/or --reasoning-config to use thinking_token_budget. (No healthy "
    "engine worker enforces a thinking budget: mmgate's worker does when its engine runs a "
    "reasoning parser.)"
)


@dataclass
class PoolOptions:
    policy: str = "round_robin"
    health_interval: float = 5.0
    health_fall: int = 3
    health_rise: int = 2
    breaker_failures: int = 5
    breaker_cooldown: float = 30.0
    retries: int = 2
    drain_timeout: float = 600.0
    dns_interval: float = 10.0
    balance_threshold: int = 8
    cache_threshold: float = 0.5
    stream_client: str = "mmgate"
    tls: WorkerTls = field(default_factory=WorkerTls)  # for grpcs:// workers


@asynccontextmanager
async def lease_scope() -> AsyncIterator[None]:
    """Workers picked inside count the request as assigned to them until the scope ends
    (for a streamed response: its last byte)."""
    token = _leases.set([])
    try:
        yield
    finally:
        for worker in _leases.get() or ():
            worker.assigned -= 1
        _leases.reset(token)


async def resolve_all(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({info[4][0] for info in infos})


class WorkerPool:
    def __init__(
        self,
        urls: Sequence[str],
        options: PoolOptions | None = None,
        dns_names: Sequence[str] = (),
        metrics: GatewayMetrics | None = None,
        resolver: Resolver = resolve_all,
    ) -> None:
        if not urls and not dns_names:
            raise ValueError("at least one --worker or --worker-dns is required")
        self.options = options or PoolOptions()
        # Cache-aware routing follows the KV events of workers that publish them.
        self.kv_events = KvEventIndex() if self.options.policy == "cache_aware" else None
        self._followers: dict[str, asyncio.Task] = {}
        self.router = Router(
            self.options.policy,
            self.options.balance_threshold,
            self.options.cache_threshold,
            events=self.kv_events,
        )
        self.metrics = metrics or GatewayMetrics()
        self.workers: dict[str, Worker] = {}
        # This process's id in each worker's item cache (send-once): each gateway process
        # (--api-server-count, replicas) gets its own partition there.
        self.sender = uuid.uuid4().hex
        for url in urls:
            self._new_worker(url)
        self.dns_names = list(dns_names)
        self._dns_members: dict[str, set[str]] = {name: set() for name in self.dns_names}
        self._resolve = resolver
        self._tasks: list[asyncio.Task] = []
        # The model's facts: from the first worker that answers, whenever it does.
        self.model: WorkerFacts | None = None
        self.model_known = asyncio.Event()

    def _new_worker(self, url: str, server_name: str | None = None) -> Worker:
        o = self.options
        worker = Worker(
            url,
            HealthGate(o.health_fall, o.health_rise),
            CircuitBreaker(o.breaker_failures, o.breaker_cooldown),
            o.stream_client,
            self.sender,
            o.tls,
            server_name,
        )
        self.workers[url] = worker
        return worker

    # ---- lifecycle ----

    async def start(self) -> WorkerFacts | None:
        """Connect to every worker and keep trying those that do not answer. Returns the
        model's facts if a worker answered, else None: the gateway then starts anyway and
        learns the model from the first worker that answers later (`model_known`)."""
        await self._resolve_dns()
        workers = list(self.workers.values())
        reached = await asyncio.gather(*(self._reach(w) for w in workers))
        for worker, facts in zip(workers, reached):  # in the order given, not of answers
            if facts is not None:
                self._admit(worker, facts)
        self._tasks.append(asyncio.create_task(self._check_forever()))
        if self.dns_names:
            self._tasks.append(asyncio.create_task(self._resolve_forever()))
        return self.model

    async def _connect(self, worker: Worker) -> None:
        facts = await self._reach(worker)
        if facts is not None:
            self._admit(worker, facts)

    async def _reach(self, worker: Worker) -> WorkerFacts | None:
        try:
            facts = await worker.connect()
        except Exception as error:  # noqa: BLE001 - a down worker is retried by health checks
            # Once per outage: an engine loading a model for minutes is not news every 5 s.
            if not worker.unreachable:
                hint = _tls_hint(worker)
                why = _one_line(error)
                log.warning("worker %s not reachable%s: %s", worker.url, hint, why)
            worker.unreachable = True
            return None
        worker.unreachable = False
        return facts

    def _admit(self, worker: Worker, facts: WorkerFacts) -> None:
        """After a (re)connection: the first worker to answer names the model; a worker
        serving another one is refused (never routed to) until it serves this one."""
        refusal = self._refusal(facts)
        if not refusal:
            log.info("worker %s answered: model %s", worker.url, facts.served_model_name)
        elif refusal != worker.refused:  # once, not at every retry
            log.error("worker %s refused: %s", worker.url, refusal)
            self.metrics.workers_refused.labels("other_model").inc()
        worker.refused = refusal
        self._follow_events(worker)
        if not refusal and self.model is None:
            self.model = facts
            self.model_known.set()

    def _follow_events(self, worker: Worker) -> None:
        """Subscribe to a (re)connected worker's KV events, once (see kv_index.follow_worker)."""
        if self.kv_events is None or worker.refused:
            return
        task = self._followers.get(worker.url)
        if task is None or task.done():
            follow = follow_worker(self.kv_events, worker.url, worker.stub.SubscribeKvEvents)
            self._followers[worker.url] = asyncio.create_task(follow)

    def _stop_following(self, url: str) -> None:
        task = self._followers.pop(url, None)
        if task is not None:
            task.cancel()
        if self.kv_events is not None:
            self.kv_events.forget(url)

    def _refusal(self, facts: WorkerFacts) -> str:
        """Why a worker's model is not the gateway's ("" when it is). `--model` does not say:
        a name given there is what clients ask for, which workers may serve under another."""
        if self.model is None:
            return ""
        if facts.served_model_name != self.model.served_model_name:
            ours = self.model.served_model_name
            return f"it serves {facts.served_model_name!r}, the gateway {ours!r}"
        if facts.vocab_size != self.model.vocab_size:
            ours = self.model.vocab_size
            return f"its vocabulary has {facts.vocab_size} tokens, the model's {ours}"
        return ""

    async def close(self) -> None:
        for url in list(self._followers):
            self._stop_following(url)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*(w.close() for w in self.workers.values()))

    # ---- routing ----

    def pick(
        self,
        prompt_ids: Sequence[int] = (),
        exclude: Sequence[Worker] = (),
        like: Worker | None = None,
        media_refs: bool = False,
        thinking_budget: bool = False,
        mm: Sequence[MmSpan] = (),
        audio_inputs: bool = False,
    ) -> Worker:
        """A worker for the request; `media_refs`: one that preprocesses media itself;
        `thinking_budget`: one that enforces a thinking budget; `mm`: the multimodal items of
        `prompt_ids` (expanded), for cache-aware routing; `audio_inputs`: one that takes audio
        the gateway preprocessed."""
        candidates = [w for w in self.workers.values() if w.eligible and w not in exclude]
        if like is not None:  # a retry: the request was prepared for `like`'s facts
            candidates = [w for w in candidates if _compatible(w.facts, like.facts)]
        if not candidates:
            raise GatewayError("no healthy engine worker is available; try again later", 503)
        if media_refs:
            candidates = [w for w in candidates if w.facts.takes_media_refs]
            if not candidates:
                raise GatewayError(NO_MEDIA_WORKER, 400, "messages")
        if audio_inputs:
            candidates = [w for w in candidates if w.facts.takes_audio_mm_inputs]
            if not candidates:
                raise GatewayError(NO_AUDIO_INPUTS_WORKER, 400, "messages")
        if thinking_budget:
            candidates = [w for w in candidates if w.facts.enforces_thinking_budget]
            if not candidates:
                raise GatewayError(NO_BUDGET_WORKER, 400)
        decision = self.router.choose(candidates, prompt_ids, mm)
        worker = decision.worker
        self.metrics.routing.labels(self.router.policy, decision.outcome).inc()
        if decision.outcome == "cache_hit":
            self.metrics.cache_matched_tokens.observe(decision.matched_tokens)
        self.metrics.worker_requests.labels(worker.url).inc()
        worker.requests += 1
        if (leases := _leases.get()) is not None:
            worker.assigned += 1
            leases.append(worker)
        return worker

    def reroute(
        self,
        failed: Sequence[Worker],
        prompt_ids: Sequence[int],
        media_refs: bool = False,
        thinking_budget: bool = False,
        mm: Sequence[MmSpan] = (),
        audio_inputs: bool = False,
    ) -> Worker | None:
        """Another worker for a request whose call failed before its first token, if any."""
        if len(failed) > self.options.retries:
            return None
        try:
            worker = self.pick(
                prompt_ids,
                exclude=failed,
                like=failed[-1],
                media_refs=media_refs,
                thinking_budget=thinking_budget,
                mm=mm,
                audio_inputs=audio_inputs,
            )
        except GatewayError:
            return None
        self.metrics.retries.inc()
        log.warning("retrying on %s after %s failed", worker.url, failed[-1].url)
        return worker

    def shared_pixels(self) -> PixelEncoding | None:
        """The pixel encoding every eligible worker takes, if they agree (the usual case): a
        request's media can then be preprocessed before its worker is picked, and routed by
        its items' hashes."""
        encodings = {w.facts.pixels for w in self.workers.values() if w.eligible and w.facts}
        return encodings.pop() if len(encodings) == 1 else None

    def any_healthy(self) -> bool:
        return any(w.eligible for w in self.workers.values())

    def any_takes_audio_inputs(self) -> bool:
        """Whether some eligible worker takes audio the gateway preprocessed."""
        return any(w.eligible and w.facts.takes_audio_mm_inputs for w in self.workers.values())

    # ---- membership ----

    async def add(self, url: str, server_name: str | None = None) -> Worker:
        """`server_name`: for a grpcs:// worker, the name its certificate must carry (a
        --worker-dns member's DNS name; default: the URL's host)."""
        parse_address(url)
        worker = self.workers.get(url)
        if worker is not None:
            worker.draining = False
            return worker
        worker = self._new_worker(url, server_name)
        log.info("worker %s added", url)
        await self._connect(worker)
        return worker

    def remove(self, url: str) -> Worker:
        """Stop routing to `url`; it is dropped once its requests have finished."""
        worker = self.workers.get(url)
        if worker is None:
            raise GatewayError(f"no worker {url}", 404, "url")
        if not worker.draining:
            worker.draining = True
            log.info("worker %s draining (%d requests)", url, worker.assigned)
            self._tasks.append(asyncio.create_task(self._drop_when_drained(worker)))
        return worker

    async def _drop_when_drained(self, worker: Worker) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.options.drain_timeout
        while (worker.assigned or worker.in_flight) and loop.time() < deadline:
            await asyncio.sleep(0.1)
        if not worker.draining:  # added back meanwhile
            return
        self.workers.pop(worker.url, None)
        self.router.prefixes.forget(worker.url)
        self._stop_following(worker.url)
        await worker.close()
        log.info("worker %s removed", worker.url)

    async def _resolve_forever(self) -> None:
        while True:
            await asyncio.sleep(self.options.dns_interval)
            await self._resolve_dns()

    async def _resolve_dns(self) -> None:
        for name in self.dns_names:
            host, port = _host_port(name)
            scheme = TLS_SCHEME if is_tls(name) else PLAIN_SCHEME
            try:
                found = {_url(scheme, ip, port) for ip in await self._resolve(host, port)}
            except OSError as error:
                log.warning("resolving %s failed: %s; keeping its workers", name, error)
                continue
            for url in sorted(found - self._dns_members[name]):
                # Dialled by IP address, a TLS member is checked against the DNS name (the
                # name a certificate for a Kubernetes service carries), not the address.
                # (An absolute name's trailing dot is no part of the certificate's name.)
                await self.add(url, server_name=host.rstrip(".") if is_tls(name) else None)
            for url in sorted(self._dns_members[name] - found):
                if url in self.workers:
                    self.remove(url)
            self._dns_members[name] = found

    # ---- health ----

    async def _check_forever(self) -> None:
        while True:
            await asyncio.sleep(self.options.health_interval)
            await asyncio.gather(*(self._check(w) for w in list(self.workers.values())))

    async def _check(self, worker: Worker) -> None:
        if worker.facts is None or worker.refused:  # ask again: it may have come back fixed
            await self._connect(worker)
            return
        was_healthy = worker.healthy
        if await worker.check_health() and not was_healthy:
            # Back after an outage: a restarted pod may serve other settings, or another model.
            await self._connect(worker)

    # ---- model files and metrics ----

    async def tokenizer_bundle(self) -> tuple[bytes, str]:
        """The model files from the first worker that sends them (see model_files)."""
        for worker in self.workers.values():
            if worker.facts is None or worker.refused:
                continue
            try:
                return await worker.tokenizer_bundle()
            except Exception as error:  # noqa: BLE001 - the next worker may answer
                log.warning("worker %s sent no tokenizer bundle: %s", worker.url, error)
        raise RuntimeError("no worker sent its tokenizer bundle (GetTokenizer)")

    def _kv_blocks(self, worker: Worker) -> float:
        events = self.kv_events
        return float(events.blocks(worker.url)) if events and events.following(worker.url) else -1.0

    def collector(self) -> GaugesFrom:
        """Per-worker gauges for /metrics, read from the workers at scrape time."""
        gauges = {
            "mmgate_worker_healthy": ("1 if the worker passes health checks", _healthy),
            "mmgate_worker_requests_in_flight": ("gRPC calls open on it", _in_flight),
            "mmgate_worker_assigned_requests": ("gateway requests routed to it", _assigned),
            "mmgate_worker_circuit_state": ("0 closed, 1 half-open, 2 open", _circuit),
            "mmgate_worker_draining": ("1 while being removed", _draining),
            "mmgate_worker_refused": ("1 while it serves another model", _refused),
            "mmgate_worker_kv_event_blocks": (
                "prefix-cache blocks its engine holds by its KV events (cache_aware routing; "
                "-1 while it publishes none)",
                self._kv_blocks,
            ),
        }
        return GaugesFrom(
            [(name, doc, ["worker"]) for name, (doc, _) in gauges.items()],
            lambda: {
                name: [([w.url], read(w)) for w in self.workers.values()]
                for name, (_, read) in gauges.items()
            },
        )


def _healthy(w: Worker) -> float:
    return float(w.healthy)


def _in_flight(w: Worker) -> float:
    return float(w.in_flight)


def _assigned(w: Worker) -> float:
    return float(w.assigned)


def _circuit(w: Worker) -> float:
    return STATE_VALUES[w.breaker.state]


def _draining(w: Worker) -> float:
    return float(w.draining)


def _refused(w: Worker) -> float:
    return float(bool(w.refused))


def _compatible(a: WorkerFacts | None, b: WorkerFacts | None) -> bool:
    return (
        a is not None
        and b is not None
        and (a.pixels, a.max_context_length)
        == (
            b.pixels,
            b.max_context_length,
        )
    )


def _host_port(url: str) -> tuple[str, int]:
    address = parse_address(url)
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _url(scheme: str, ip: str, port: int) -> str:
    return f"{scheme}[{ip}]:{port}" if ":" in ip else f"{scheme}{ip}:{port}"


def _one_line(error: Exception) -> str:
    """An error for one log line: a gRPC error's code and details (gRPC's own str() spans
    several lines)."""
    if isinstance(error, grpc.aio.AioRpcError):
        return f"{error.code().name}: {error.details()}"
    return str(error).replace("\n", " ")


def _tls_hint(worker: Worker) -> str:
    if not worker.tls:
        return ""
    return (
        " (grpcs://: no plain-text fallback; a failed TLS handshake shows here: check the "
        "worker's certificate and name against --ca-cert-paths, and --client-cert-path if it "
        "requires a client certificate)"
    )
