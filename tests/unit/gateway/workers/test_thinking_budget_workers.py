"""A thinking budget goes only to a worker that advertised it enforces one: the worker's
GetServerInfo trailing metadata becomes its facts, the pool picks (and reroutes) among such
workers, and with none the request is vLLM's 400 for an engine without a reasoning config."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from gateway.errors import GatewayError
from gateway.workers.pool import WorkerPool
from gateway.workers.worker import Worker, WorkerFacts
from multimodal.pipeline import PixelEncoding
from protos import extensions
from protos import vllm_engine_pb2 as pb
from protos import vllm_engine_pb2_grpc as pb_grpc

# vLLM's input processor, word for word, for a budget its engine cannot enforce
VLLM_MESSAGE = (
    "thinking_token_budget is set but reasoning_config is not configured. Please set "
    "--reasoning-parser and/or --reasoning-config to use thinking_token_budget."
)


def facts(*names: str) -> WorkerFacts:
    return WorkerFacts(
        model_path="m",
        served_model_name="m",
        max_context_length=1024,
        vocab_size=100,
        eos_token_ids=[1],
        supports_vision=False,
        is_generation=True,
        pixels=PixelEncoding.for_engine(False, ""),
        extensions=frozenset(names),
    )


async def _pool(*worker_facts: WorkerFacts) -> WorkerPool:
    pool = WorkerPool([f"grpc://127.0.0.1:{1 + i}" for i in range(len(worker_facts))])
    for worker, given in zip(pool.workers.values(), worker_facts):
        worker.facts = given
        worker.health.force(True)
    return pool


def test_a_budget_goes_only_to_a_worker_that_enforces_one():
    async def run():
        pool = await _pool(facts(), facts(extensions.ENFORCES_THINKING_BUDGET))
        plain, enforcing = pool.workers.values()
        try:
            assert {pool.pick(thinking_budget=True) for _ in range(4)} == {enforcing}
            assert {pool.pick() for _ in range(4)} == {plain, enforcing}
            assert pool.reroute([enforcing], [], thinking_budget=True) is None
            assert pool.reroute([enforcing], []) is plain
        finally:
            await pool.close()

    asyncio.run(run())


def test_no_enforcing_worker_is_vllm_s_400():
    async def run():
        pool = await _pool(facts(), facts("some_other_addition"))
        try:
            with pytest.raises(GatewayError) as refused:
                pool.pick(thinking_budget=True)
            assert refused.value.status == 400 and refused.value.param is None
            assert refused.value.message.startswith(VLLM_MESSAGE)
        finally:
            await pool.close()

    asyncio.run(run())


class _Servicer(pb_grpc.VllmEngineServicer):
    def __init__(self, trailing: tuple[tuple[str, str], ...]) -> None:
        self.trailing = trailing

    async def GetModelInfo(self, request, context):  # noqa: N802
        return pb.GetModelInfoResponse(served_model_name="m", is_generation=True)

    async def GetServerInfo(self, request, context):  # noqa: N802
        context.set_trailing_metadata(self.trailing)
        return pb.GetServerInfoResponse(server_type="vllm-grpc")


@pytest.mark.parametrize(
    ("trailing", "enforces"),
    [
        (extensions.capabilities_metadata({extensions.ENFORCES_THINKING_BUDGET}), True),
        ((), False),  # SMG's upstream servicer: no metadata
    ],
)
def test_the_worker_s_advertisement_becomes_its_facts(trailing, enforces):
    async def run():
        server = grpc.aio.server()
        pb_grpc.add_VllmEngineServicer_to_server(_Servicer(trailing), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        worker = Worker(f"grpc://127.0.0.1:{port}")
        try:
            return (await worker.connect()).enforces_thinking_budget
        finally:
            await worker.close()
            await server.stop(None)

    assert asyncio.run(run()) is enforces
