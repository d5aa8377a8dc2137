"""Send-once through the gateway's call path (SendOnceTail, RetryingGenerate) to a worker
stand-in that runs the real item cache and the real prompt builder: a chat resending two
images sends their pixels once, the worker's items equal those of a request sent in full,
and a flushed or restarted worker costs one resend on the same worker, counted, with the
client seeing a normal answer. Several gateways sending to one worker (one cache, a
partition each) each send the pixels once; one gateway too many drops the least recently
used one's partition, which costs that gateway one resend, after which it hits again."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from engine_server.errors import CacheMissError
from engine_server.mm_inputs import build_mm_prompt
from engine_server.mm_item_cache import ItemCache
from engine_server.servicer import prompt_items
from gateway.observability.metrics import GatewayMetrics
from gateway.workers.retry import RetryingGenerate
from gateway.workers.send_once import ItemMirror
from gateway.workers.tensor_transport import InlineTail, SendOnceTail
from multimodal.wire import flatten
from protos import extensions
from protos import vllm_engine_pb2 as pb
from tests.unit.engine_server.test_mm_item_cache import CONTRACT, assert_same_items, prepared
from tests.unit.gateway.workers.test_tensor_transport import facts


class CachingWorker:
    """Builds each request's prompt as `mmgate engine` does, with its item cache; as one
    gateway process's Worker for it (`sender`: several may share one cache)."""

    url = "grpc://w:1"

    def __init__(self, cache: ItemCache, sender: str = "") -> None:
        self.cache, self.facts = cache, facts()
        self.mm_items: ItemMirror | None = ItemMirror(cache.info.max_bytes, cache.instance, sender)
        self.pixel_bytes: list[int] = []  # per call received
        self.prompts: list = []

    def record_call(self, error) -> None:
        pass

    async def generate(self, request, tail, metadata=()):
        req = pb.GenerateRequest.FromString(b"".join([request.SerializeToString(), *tail]))
        self.pixel_bytes.append(len(req.mm_inputs.pixel_values.inline))
        call = extensions.item_cache_call(metadata)
        try:
            cached = self.cache.lookup(call) if call is not None else {}
        except CacheMissError as error:
            code = grpc.StatusCode.FAILED_PRECONDITION
            meta = grpc.aio.Metadata()
            raise grpc.aio.AioRpcError(code, meta, meta, str(error)) from None
        batches = [req.mm_inputs]
        prompt = build_mm_prompt(list(req.tokenized.input_ids), batches, CONTRACT, cached=cached)
        if call is not None:
            self.cache.update(call, prompt_items(prompt))
        self.prompts.append(prompt)
        yield pb.GenerateResponse(chunk=pb.GenerateStreamChunk(token_ids=[1]))
        yield pb.GenerateResponse(complete=pb.GenerateComplete(finish_reason="stop"))


def turn(worker: CachingWorker, metrics: GatewayMetrics) -> list:
    p = prepared()
    tail = SendOnceTail(p, InlineTail(flatten(p.request_nodes())))
    head = pb.GenerateRequest(tokenized=pb.TokenizedInput(input_ids=p.prompt_ids))
    call = RetryingGenerate(worker, head, tail, metrics=metrics)  # type: ignore[arg-type]

    async def run() -> list:
        return [r async for r in call.responses()]

    return asyncio.run(run())


def value(metrics: GatewayMetrics, name: str) -> float:
    return metrics.registry.get_sample_value(f"mmgate_mm_send_once_{name}_total") or 0.0


@pytest.fixture
def reference():
    """The worker's prompt for the request sent in full, without any cache."""
    worker = CachingWorker(ItemCache(1 << 20))
    worker.mm_items = None
    turn(worker, GatewayMetrics())
    return worker.prompts[0]


def test_a_chat_resending_two_images_sends_their_pixels_once(reference):
    worker, metrics = CachingWorker(ItemCache(1 << 20)), GatewayMetrics()
    for _ in range(3):
        assert len(turn(worker, metrics)) == 2
    full = worker.pixel_bytes[0]
    assert full == (16 + 32) * 12 * 4 and worker.pixel_bytes[1:] == [0, 0]
    for prompt in worker.prompts:
        assert_same_items(prompt, reference)
    assert value(metrics, "hits") == 4 and value(metrics, "bytes_saved") == 2 * (full + 2 * 32)
    assert value(metrics, "resends") == 0


def test_a_flushed_worker_costs_one_resend(reference):
    worker, metrics = CachingWorker(ItemCache(1 << 20)), GatewayMetrics()
    turn(worker, metrics)
    turn(worker, metrics)
    worker.cache.clear()  # FlushCache
    assert len(turn(worker, metrics)) == 2
    assert worker.pixel_bytes[2:] == [0, worker.pixel_bytes[0]]  # refused, then sent in full
    assert value(metrics, "resends") == 1
    turn(worker, metrics)
    assert worker.pixel_bytes[-1] == 0  # kept again by the resend
    for prompt in worker.prompts:
        assert_same_items(prompt, reference)


def test_a_restarted_worker_is_mirrored_afresh(reference):
    worker, metrics = CachingWorker(ItemCache(1 << 20, "life-1")), GatewayMetrics()
    turn(worker, metrics)
    turn(worker, metrics)
    worker.cache = ItemCache(1 << 20, "life-2")  # the same address, a new process
    turn(worker, metrics)
    assert worker.mm_items is not None and worker.mm_items.instance == "life-2"
    assert value(metrics, "resends") == 1
    turn(worker, metrics)
    assert worker.pixel_bytes[-1] == 0
    for prompt in worker.prompts:
        assert_same_items(prompt, reference)


def test_a_worker_without_the_cache_gets_everything_and_no_orders(reference):
    worker = CachingWorker(ItemCache(1 << 20))
    worker.mm_items = None  # it advertised nothing: SMG's servicer, an older worker
    seen = []
    original = worker.generate

    async def spy(request, tail, metadata=()):
        seen.append(dict(metadata))
        async for response in original(request, tail, metadata):
            yield response

    worker.generate = spy  # type: ignore[method-assign]
    turn(worker, GatewayMetrics())
    turn(worker, GatewayMetrics())
    assert worker.pixel_bytes[0] == worker.pixel_bytes[1] > 0
    assert all(extensions.MM_CACHE_INSTANCE not in m for m in seen)


def test_gateways_sharing_a_worker_each_send_the_pixels_once(reference):
    cache = ItemCache(1 << 20, senders=2)
    gateways, metrics = [CachingWorker(cache, s) for s in ("A", "B")], GatewayMetrics()
    for _ in range(3):  # alternating turns of the same conversation
        for gateway in gateways:
            assert len(turn(gateway, metrics)) == 2
    full = gateways[0].pixel_bytes[0]
    for gateway in gateways:
        assert gateway.pixel_bytes == [full, 0, 0]
        assert set(cache.keys(gateway.mm_items.sender)) == set(gateway.mm_items.entries)
        for prompt in gateway.prompts:
            assert_same_items(prompt, reference)
    assert value(metrics, "hits") == 8 and value(metrics, "resends") == 0
    assert cache.self_evictions == 0 and cache.used == 2 * cache.partition_used("A") > 0


def test_one_gateway_too_many_costs_the_least_recent_one_a_resend(reference):
    cache = ItemCache(1 << 20, senders=2)
    a, b, c = (CachingWorker(cache, s) for s in "ABC")
    metrics = GatewayMetrics()
    for gateway in (a, b, a, b, c):  # C takes the partition of A, the least recent
        turn(gateway, metrics)
    assert cache.sender_ids == ["B", "C"] and value(metrics, "resends") == 0
    before = a.mm_items
    turn(a, metrics)  # leaves both out: refused, partition gone; sent in full
    turn(a, metrics)
    full = a.pixel_bytes[0]
    assert a.pixel_bytes == [full, 0, 0, full, 0] and value(metrics, "resends") == 1
    mirror = a.mm_items
    assert mirror is not before and mirror.partition > before.partition  # forgot it all
    assert set(mirror.entries) == set(cache.keys("A")) and len(mirror.entries) == 2
    assert cache.sender_ids == ["C", "A"]  # B was the least recent then
    assert cache.used <= cache.max_bytes and cache.self_evictions == 0
    for prompt in a.prompts:
        assert_same_items(prompt, reference)
