"""Embed on a pooling model equals AsyncLLM.encode on the same model (issue 2, item 4)."""

from __future__ import annotations

import math

import grpc
import pytest

from protos import common_pb2
from protos import vllm_engine_pb2 as pb
from tests.support.engines import ReferenceEngine, serve_worker

POOLING = {"runner": "pooling", "max_model_len": 512}
TEXTS = ["the quick brown fox", "import os\nprint(os.getcwd())"]


@pytest.fixture(scope="module")
def tokenizer(embedding_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(embedding_model)


@pytest.fixture(scope="module")
def worker(embedding_model, tmp_path_factory):
    yield from serve_worker(embedding_model, tmp_path_factory, "embed", **POOLING)


@pytest.fixture(scope="module")
def reference(embedding_model):
    ref = ReferenceEngine(embedding_model, **POOLING)
    yield ref
    ref.close()


@pytest.mark.parametrize("text", TEXTS)
def test_embed_equals_asyncllm_encode(worker, reference, tokenizer, text):
    ids = tokenizer.encode(text)
    reply = worker.stub().Embed(
        pb.EmbedRequest(request_id=f"e-{text}", tokenized=pb.TokenizedInput(input_ids=ids))
    )
    expected = reference.embed(ids, f"ref-{text}")
    assert reply.prompt_tokens == len(ids)
    assert reply.embedding_dim == len(expected) == len(reply.embedding) == 128
    assert all(math.isclose(a, b, abs_tol=1e-5) for a, b in zip(reply.embedding, expected))


def test_embedding_model_reports_itself(worker):
    info = worker.stub().GetModelInfo(pb.GetModelInfoRequest())
    assert info.is_generation is False
    assert info.max_context_length == 512


def test_embed_rejects_empty_and_out_of_vocab(worker):
    for ids in ([], [10**6]):
        with pytest.raises(grpc.RpcError) as err:
            worker.stub().Embed(pb.EmbedRequest(tokenized=pb.TokenizedInput(input_ids=ids)))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_openai_embeddings_through_the_gateway(
    worker, reference, tokenizer, embedding_model, tmp_path_factory
):
    from tests.support.gateway_process import GatewayProcess

    log = tmp_path_factory.mktemp("gw-embed") / "gateway.log"
    gateway = GatewayProcess(embedding_model, [worker.address], log).wait_ready()
    try:
        client = gateway.client()
        reply = client.embeddings.create(model=client.models.list().data[0].id, input=TEXTS)
        for item, text in zip(reply.data, TEXTS):
            expected = reference.embed(tokenizer.encode(text), f"gw-{text}")
            assert all(math.isclose(a, b, abs_tol=1e-5) for a, b in zip(item.embedding, expected))
        assert reply.usage.prompt_tokens == sum(len(tokenizer.encode(t)) for t in TEXTS)
    finally:
        gateway.stop()


def test_kv_events_are_unimplemented_without_the_flag(worker):
    with pytest.raises(grpc.RpcError) as err:
        list(worker.stub().SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest(), timeout=30))
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "--kv-events-config" in err.value.details()
