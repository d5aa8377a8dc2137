"""The worker pool with real workers (our engine on vLLM): cache-aware routing measured by the
engines' own prefix-cache hits, balancing under overload, runtime membership (admin endpoint and
DNS), draining, a worker killed mid-load, and admission limits."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import httpx
import pytest

from gateway.workers.pool import PoolOptions, WorkerPool
from protos import vllm_engine_pb2 as pb
from tests.support.engines import WorkerProcess, serve_worker
from tests.support.gateway_process import GatewayProcess


@pytest.fixture(scope="module")
def worker_b(text_model, text_worker, tmp_path_factory):
    """A second worker, on 127.0.0.2 and the same port as text_worker (two DNS addresses)."""
    yield from serve_worker(
        text_model, tmp_path_factory, "worker-b", host="127.0.0.2", port=text_worker.port
    )


def start_gateway(model: Path, workers: list[str], log_dir: Path, *extra: str) -> GatewayProcess:
    log_dir.mkdir(parents=True, exist_ok=True)
    return GatewayProcess(model, workers, log_dir / "gateway.log", *extra).wait_ready()


def system_prompt(topic: str) -> str:
    return f"You are an expert on {topic}. " + " ".join(f"{topic}-fact-{i}." for i in range(25))


def chat(gateway: GatewayProcess, system: str, question: str, **extra) -> dict:
    body = {
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ],
        "max_tokens": 1,
        **extra,
    }
    reply = httpx.post(f"{gateway.base_url}/v1/chat/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


def workers_state(gateway: GatewayProcess) -> dict[str, dict]:
    listing = httpx.get(f"{gateway.base_url}/admin/workers", timeout=10).json()
    return {w["url"]: w for w in listing["workers"]}


def kv_event_blocks(gateway: GatewayProcess) -> dict[str, float]:
    """mmgate_worker_kv_event_blocks per worker URL, from the gateway's /metrics."""
    text = httpx.get(f"{gateway.base_url}/metrics", timeout=10).text
    found = {}
    for line in text.splitlines():
        if line.startswith("mmgate_worker_kv_event_blocks{"):
            head, _, value = line.rpartition(" ")
            found[head.split('worker="')[1].split('"')[0]] = float(value)
    return found


def cache_hit_rate(gateway: GatewayProcess, topics: list[str]) -> float:
    """Share of repeat requests (same system prompt) whose prefix the engine had cached."""
    hits = repeats = 0
    for round_ in range(3):
        for topic in topics:
            usage = chat(gateway, system_prompt(topic), f"question {round_}?")["usage"]
            if round_:
                repeats += 1
                hits += usage["prompt_tokens_details"]["cached_tokens"] >= 256
    return hits / repeats


def test_cache_aware_routing_hits_the_engines_prefix_cache(
    text_model, text_worker, worker_b, tmp_path
):
    workers = [text_worker.address, worker_b.address]
    results = {}
    for policy in ("cache_aware", "round_robin"):
        gateway = start_gateway(text_model, workers, tmp_path / policy, "--policy", policy)
        try:
            topics = [f"{policy}-{name}" for name in ("tides", "ferns", "gears")]
            results[policy] = cache_hit_rate(gateway, topics)
            if policy == "cache_aware":
                # text_worker publishes its KV events and the gateway follows them; worker_b
                # publishes none (UNIMPLEMENTED) and is routed by the gateway's guess.
                blocks = kv_event_blocks(gateway)
                assert blocks[f"grpc://{text_worker.address}"] > 0, blocks
                assert blocks[f"grpc://{worker_b.address}"] == -1, blocks
        finally:
            gateway.stop()
    assert results["cache_aware"] == 1.0, results
    assert results["round_robin"] < 0.8, results  # the same requests, spread without regard


class Stream:
    """A long streamed chat request in a thread: started, first token seen, then its end."""

    def __init__(self, gateway: GatewayProcess, system: str = "", max_tokens: int = 900) -> None:
        self.body = {
            "messages": [
                {"role": "system", "content": system or "You talk a lot."},
                {"role": "user", "content": "Go on."},
            ],
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
        }
        self.url = f"{gateway.base_url}/v1/chat/completions"
        self.started = threading.Event()
        self.events: list[str] = []
        self.status = 0
        self.error_body = ""
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        with httpx.stream("POST", self.url, json=self.body, timeout=120) as reply:
            self.status = reply.status_code
            if self.status != 200:
                self.error_body = reply.read().decode()
            for line in reply.iter_lines():
                if line.startswith("data: "):
                    self.events.append(line[6:])
                    if '"content": "' in line and '"content": ""' not in line:
                        self.started.set()
                if self.stop.is_set():
                    break
        self.started.set()

    def finish(self, timeout: float = 60) -> str:
        """'done' (finish_reason seen), 'error' (an error event) or 'cut' (closed by us)."""
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the stream hung"
        bodies = [json.loads(e) for e in self.events if e != "[DONE]"]
        if any("error" in body for body in bodies):
            return "error"
        if any(c["finish_reason"] == "length" for b in bodies for c in b["choices"]):
            assert self.events[-1] == "[DONE]"
            return "done"
        return "cut"


def test_cache_aware_balances_an_overloaded_worker(text_model, text_worker, worker_b, tmp_path):
    """Four streams sharing one long prefix, one after the other: the first two go to the
    prefix's home, then the home is more than `--balance-threshold 1` ahead and the next ones
    go to the other worker. Both workers are frozen (SIGSTOP) once the gateway has connected
    to them, so every stream stays open while the later ones are routed, however fast the
    engines are; the test checks where the gateway sent them."""
    workers = [text_worker, worker_b]
    flags = ["--policy", "cache_aware", "--balance-threshold", "1", "--health-interval", "60"]
    gateway = start_gateway(text_model, [w.address for w in workers], tmp_path, *flags)
    system = system_prompt("hot-prefix")
    streams: list[Stream] = []
    for worker in workers:
        worker.freeze()
    try:
        for count in range(1, 5):
            streams.append(Stream(gateway, system, max_tokens=990))
            assigned = _wait_assigned(gateway, total=count)
            if count == 2:
                assert sorted(assigned.values()) == [0, 2], assigned  # the prefix's home
        assert sorted(assigned.values()) == [2, 2], assigned  # not 4 on the prefix's home
        metrics = httpx.get(f"{gateway.base_url}/metrics").text
        assert 'outcome="imbalanced",policy="cache_aware"} 1.0' in metrics
    finally:
        for worker in workers:
            worker.thaw()
        for stream in streams:
            stream.stop.set()
        for stream in streams:  # cut at their next token: the workers abort them
            stream.thread.join(60)
        gateway.stop()


def _wait_assigned(gateway: GatewayProcess, total: int, timeout: float = 30) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while True:
        assigned = {url: w["assigned_requests"] for url, w in workers_state(gateway).items()}
        if sum(assigned.values()) >= total or time.monotonic() > deadline:
            return assigned
        time.sleep(0.05)


def test_workers_added_and_drained_at_runtime(text_model, text_worker, worker_b, tmp_path):
    gateway = start_gateway(text_model, [text_worker.address], tmp_path)
    b_url = f"grpc://{worker_b.address}"
    try:
        added = httpx.post(f"{gateway.base_url}/admin/workers", json={"url": b_url}, timeout=30)
        assert added.status_code == 201 and added.json()["connected"]
        for i in range(4):
            chat(gateway, "s", f"q{i}")
        assert workers_state(gateway)[b_url]["requests_total"] == 2  # round robin reaches it
        streams = [Stream(gateway, max_tokens=900) for _ in range(2)]  # one on each worker
        for stream in streams:
            assert stream.started.wait(60)
        assert workers_state(gateway)[b_url]["assigned_requests"] == 1
        removed = httpx.request(
            "DELETE", f"{gateway.base_url}/admin/workers", json={"url": b_url}, timeout=10
        )
        assert removed.status_code == 202 and removed.json()["draining"]
        assert removed.json()["assigned_requests"] == 1  # still serving its stream
        a_url = f"grpc://{text_worker.address}"
        before = workers_state(gateway)[a_url]["requests_total"]
        for i in range(3):
            chat(gateway, "s", f"after {i}")
        assert workers_state(gateway)[a_url]["requests_total"] == before + 3  # none to b
        assert [s.finish() for s in streams] == ["done", "done"]  # the drained one finished
        deadline = time.monotonic() + 5
        while b_url in workers_state(gateway) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert b_url not in workers_state(gateway)
    finally:
        gateway.stop()


def test_dns_names_are_followed(text_worker, worker_b):
    """A name whose addresses change: new ones join and get traffic, vanished ones drain."""
    addresses = ["127.0.0.1"]

    async def resolver(host: str, port: int) -> list[str]:
        assert (host, port) == ("workers.test", text_worker.port)
        return list(addresses)

    async def run():
        pool = WorkerPool(
            [],
            PoolOptions(dns_interval=0.1),
            dns_names=[f"grpc://workers.test:{text_worker.port}"],
            resolver=resolver,
        )
        await pool.start()
        try:
            assert list(pool.workers) == [f"grpc://{text_worker.address}"]
            addresses.append("127.0.0.2")
            await asyncio.sleep(0.5)
            new = pool.workers[f"grpc://{worker_b.address}"]
            assert new.eligible
            picked = [pool.pick() for _ in range(4)]
            assert picked.count(new) == 2
            request = pb.GenerateRequest(
                request_id="dns-1",
                tokenized=pb.TokenizedInput(input_ids=[21, 22, 23]),
                sampling_params=pb.SamplingParams(temperature=0.0, max_tokens=3),
                stream=True,
            )
            replies = [r async for r in new.generate(request)]
            assert replies[-1].complete.finish_reason == "length"
            addresses.remove("127.0.0.1")
            await asyncio.sleep(0.5)
            assert list(pool.workers) == [new.url]
        finally:
            await pool.close()

    asyncio.run(run())


def test_worker_dns_through_the_system_resolver(text_model, text_worker, tmp_path):
    """`--worker-dns` with a name the machine resolves (localhost, from /etc/hosts): the pool
    finds the worker at 127.0.0.1 and serves through it."""
    name = f"grpc://localhost:{text_worker.port}"
    gateway = start_gateway(text_model, [], tmp_path, "--worker-dns", name)
    try:
        assert chat(gateway, "s", "via DNS")["usage"]["completion_tokens"] == 1
        member = workers_state(gateway)[f"grpc://{text_worker.address}"]
        assert member["healthy"] and member["requests_total"] >= 1, member
    finally:
        gateway.stop()


def test_over_limit_load_is_refused_fast(text_model, text_worker, tmp_path):
    """Admission is the gateway's own. Two streams fill the two slots on a real worker, which
    is then frozen (SIGSTOP) so they stay in flight however fast the engine is; two more wait
    in the queue, the fifth is refused at once, and the queued ones give up after 5 s."""
    limits = ["--max-in-flight", "2", "--max-queue", "2", "--queue-timeout", "5"]
    flags = [*limits, "--health-interval", "60"]
    gateway = start_gateway(text_model, [text_worker.address], tmp_path, *flags)
    running = [Stream(gateway, max_tokens=990) for _ in range(2)]
    try:
        for stream in running:
            assert stream.started.wait(60)
        text_worker.freeze()
        queued = [Stream(gateway) for _ in range(2)]
        deadline = time.monotonic() + 10
        while "mmgate_queue_depth 2.0" not in httpx.get(f"{gateway.base_url}/metrics").text:
            assert time.monotonic() < deadline, "the two requests never queued"
            time.sleep(0.05)
        started = time.monotonic()
        refused = httpx.post(
            f"{gateway.base_url}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "x"}]},
            timeout=10,
        )
        assert time.monotonic() - started < 1.0  # not queued behind the others
        # refused at once: the queued ones are still waiting out their 5 s
        assert refused.status_code == 429 and [s.status for s in queued] == [0, 0]
        assert "capacity" in refused.json()["error"]["message"]
        for stream in queued:
            stream.thread.join(20)
            assert stream.status == 503  # waited their 5 s, then gave up
        assert "no capacity within 5 s" in stream.error_body, stream.error_body
        metrics = httpx.get(f"{gateway.base_url}/metrics").text
        assert 'mmgate_rejected_requests_total{reason="queue_full"} 1.0' in metrics
        assert 'mmgate_rejected_requests_total{reason="timeout"} 2.0' in metrics
    finally:
        text_worker.thaw()
        for stream in running:
            stream.stop.set()
        for stream in running:  # cut at their next token: the worker aborts them
            stream.thread.join(60)
        gateway.stop()


def _three_frozen_streams(gateway: GatewayProcess, doomed: WorkerProcess) -> list[Stream]:
    """Three streams on `doomed`, each past its first token, and `doomed` frozen. A loaded
    machine may begin one stream seconds after the others, long enough for those to finish
    their 990 tokens before the freeze: such streams are replaced until three are live."""
    live: list[Stream] = []
    for _ in range(5):
        live += [Stream(gateway, max_tokens=990) for _ in range(3 - len(live))]
        for stream in live:
            assert stream.started.wait(60)
        doomed.freeze()
        time.sleep(0.5)  # what a finished stream had still in flight reaches it
        live = [stream for stream in live if stream.thread.is_alive()]
        if len(live) == 3:
            return live
        doomed.thaw()
    raise AssertionError("never had three streams live on the worker at once")


def test_killing_a_worker_mid_load(text_model, text_worker, tmp_path_factory, tmp_path):
    """Streams on the killed worker end with an error event, new requests go to the other,
    nothing hangs. The gateway starts with the doomed worker alone: it takes three streams,
    which start together and are frozen (SIGSTOP) at their first tokens, so none can end
    before the kill however fast the worker generates. The other worker then joins (admin
    endpoint) and, least loaded, takes the next three."""
    doomed_fixture = serve_worker(text_model, tmp_path_factory, "doomed")
    doomed = next(doomed_fixture)
    doomed_url = f"grpc://{doomed.address}"
    # Health checks out of the way: only failed calls (retry, circuit breaker) act here.
    flags = ["--health-interval", "60", "--breaker-failures", "4", "--policy", "least_requests"]
    gateway = start_gateway(text_model, [doomed.address], tmp_path, *flags)
    try:
        on_doomed = _three_frozen_streams(gateway, doomed)
        other = {"url": f"grpc://{text_worker.address}"}
        added = httpx.post(f"{gateway.base_url}/admin/workers", json=other, timeout=30)
        assert added.status_code == 201 and added.json()["eligible"], added.text
        steady = [Stream(gateway, max_tokens=990) for _ in range(3)]
        for stream in steady:
            assert stream.started.wait(60)
        assert workers_state(gateway)[doomed_url]["assigned_requests"] == 3
        doomed.kill()
        assert [stream.finish() for stream in on_doomed] == ["error"] * 3
        assert [stream.finish() for stream in steady] == ["done"] * 3
        last = [json.loads(stream.events[-2]) for stream in on_doomed]
        assert all(body["error"]["code"] == 503 for body in last)  # then [DONE]
        for i in range(6):  # all succeed: the first sent to the dead worker is retried on the
            chat(gateway, "s", f"after the kill {i}")  # other, and its 4th failure opens
        metrics = httpx.get(f"{gateway.base_url}/metrics").text  # the circuit: no more tries
        retries = next(ln for ln in metrics.splitlines() if ln.startswith("mmgate_retries_total"))
        assert float(retries.split()[-1]) == 1
        assert workers_state(gateway)[doomed_url]["circuit"] == "open"
    finally:
        gateway.stop()
        next(doomed_fixture, None)
