"""The gateway's worker client against a real worker."""

from __future__ import annotations

import asyncio
import hashlib
import time

import pytest

from gateway.errors import GatewayError
from gateway.workers.worker import Worker, parse_address
from protos import vllm_engine_pb2 as pb


def long_request(request_id: str) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=request_id,
        tokenized=pb.TokenizedInput(input_ids=[21, 22, 23]),
        sampling_params=pb.SamplingParams(temperature=0.0, max_tokens=500, ignore_eos=True),
        stream=True,
    )


GREEDY_TOKENS: dict[str, list[int]] = {}
CLIENTS = pytest.mark.parametrize("client", ["mmgate", "grpcio"])


@CLIENTS
def test_facts_and_a_streamed_generation(text_worker, text_model, client):
    async def run():
        worker = Worker(f"grpc://{text_worker.address}", stream_client=client)
        facts = await worker.connect()
        assert facts.model_path == str(text_model) and facts.is_generation
        assert facts.max_context_length == 1024 and not facts.supports_vision
        assert facts.eos_token_ids == [3002, 3000]
        assert await worker.check_health()
        request = long_request(f"w-1-{client}")
        request.sampling_params.max_tokens = 8
        tokens = [
            t
            async for r in worker.generate(request)
            if r.HasField("chunk")
            for t in r.chunk.token_ids
        ]
        bundle = await worker.tokenizer_bundle()
        await worker.close()
        return tokens, bundle

    tokens, (bundle, digest) = asyncio.run(run())
    assert len(tokens) == 8
    # Greedy decoding of the same prompt: both clients must hand over the same tokens.
    GREEDY_TOKENS.setdefault("tokens", tokens)
    assert tokens == GREEDY_TOKENS["tokens"]
    assert bundle[:2] == b"PK" and hashlib.sha256(bundle).hexdigest() == digest


@CLIENTS
def test_abandoning_a_stream_frees_the_engine(text_worker, client):
    async def run():
        worker = Worker(f"grpc://{text_worker.address}", stream_client=client)
        async for response in worker.generate(long_request(f"w-abandon-{client}")):
            if response.HasField("chunk"):
                break  # the client went away
        await worker.close()

    asyncio.run(run())
    stub = text_worker.stub()
    deadline = time.monotonic() + 10
    while (
        stub.GetLoads(pb.GetLoadsRequest()).loads[0].num_total_reqs and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert stub.GetLoads(pb.GetLoadsRequest()).loads[0].num_total_reqs == 0


def test_unreachable_worker_is_unhealthy():
    async def run():
        worker = Worker("grpc://127.0.0.1:1")
        healthy = await worker.check_health(timeout=1)
        await worker.close()
        return healthy

    assert asyncio.run(run()) is False


@pytest.mark.parametrize("bad", ["http://x:1", "localhost", "grpc://host"])
def test_bad_worker_urls_are_refused(bad):
    with pytest.raises(GatewayError) as refused:
        parse_address(bad)
    assert refused.value.status == 400 and refused.value.param == "url"
