"""SMG 1.13.0 (the Rust router, from PyPI) driving our worker (issue 2, item 3)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from protos import vllm_engine_pb2 as pb
from tests.support.engines import direct_chat, free_port
from tests.support.smg import run_smg, smg_client

MESSAGES = [{"role": "user", "content": "Write a haiku about the sea."}]


SMG_METRICS = free_port()


@pytest.fixture(scope="module")
def smg(text_worker, tmp_path_factory) -> Iterator[str]:
    # Its default policy, cache_aware, subscribes to the worker's KV events; its index must
    # be told the engine's block size (vLLM's default on CPU is 128, SMG's 16).
    block = text_worker.stub().GetServerInfo(pb.GetServerInfoRequest()).block_size
    log = tmp_path_factory.mktemp("smg") / "smg.log"
    with run_smg(
        [text_worker.address], log, "--block-size", str(block), metrics=SMG_METRICS
    ) as base:
        yield base


@pytest.fixture(scope="module")
def expected(text_worker, text_model):
    """What our worker generates for the chat-templated prompt, asked directly."""
    return direct_chat(text_worker.stub(), text_model, MESSAGES, 12)


def client(base: str):
    return smg_client(base)


def test_chat_completion_through_smg(smg, expected):
    ids, _, text = expected
    model = client(smg).models.list().data[0].id
    reply = client(smg).chat.completions.create(
        model=model, messages=MESSAGES, temperature=0, max_tokens=12
    )
    assert reply.usage.prompt_tokens == len(ids)
    assert reply.usage.completion_tokens == 12
    assert reply.choices[0].message.content == text
    assert reply.choices[0].finish_reason == "length"


def test_streaming_chat_completion_through_smg(smg, expected):
    _, _, text = expected
    model = client(smg).models.list().data[0].id
    stream = client(smg).chat.completions.create(
        model=model, messages=MESSAGES, temperature=0, max_tokens=12, stream=True
    )
    pieces, finish = [], None
    for chunk in stream:
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert "".join(pieces) == text
    assert finish == "length"


def smg_metric(name: str, **labels: str) -> float:
    """The sum of SMG's samples of `name` with these labels."""
    text = httpx.get(f"http://127.0.0.1:{SMG_METRICS}/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        head, _, value = line.rpartition(" ")
        if head.split("{")[0] == name and all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def test_smg_routes_by_our_workers_kv_events(smg, text_worker):
    """SMG subscribes to our worker's SubscribeKvEvents and applies the batches to its
    event-driven cache index: the blocks a long prompt stored reach it."""
    worker = f"grpc://{text_worker.address}"
    assert smg_metric("smg_kv_events_unavailable", worker=worker) == 0
    model = client(smg).models.list().data[0].id
    content = "Tell me about the sea. " + " ".join(f"wave {i}." for i in range(150))
    for _ in range(2):
        client(smg).chat.completions.create(
            model=model, messages=[{"role": "user", "content": content}], max_tokens=1
        )
    deadline = time.monotonic() + 30
    while smg_metric("smg_kv_event_blocks_total", worker=worker, op="stored") == 0:
        assert time.monotonic() < deadline, "SMG applied no stored block of our worker"
        time.sleep(0.5)
    assert smg_metric("smg_kv_event_batches_total", worker=worker, disposition="applied") > 0
    assert smg_metric("smg_kv_event_subscriptions_total", worker=worker) >= 1
    assert smg_metric("smg_kv_event_resyncs_total", worker=worker) == 0
