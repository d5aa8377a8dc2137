"""The KV-event relay against vLLM's own publisher: its ZmqEventPublisher (live PUB and replay
ROUTER) and its event structs, encoded as vLLM encodes them; no engine needed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import msgspec
import pytest
import zmq
from vllm.distributed.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    ZmqEventPublisher,
)

from engine_server import kv_events
from engine_server.kv_events import Normalizer, RankSource, RelayFailure, relay
from protos import common_pb2
from tests.support.engines import free_port

BLOCK = 4


def stored(hashes, tokens, parent=None, **extra) -> BlockStored:
    fields = dict(lora_id=None, medium="GPU", lora_name=None) | extra
    return BlockStored(
        block_hashes=hashes, parent_block_hash=parent, token_ids=tokens, block_size=BLOCK, **fields
    )


def encode(*events, rank: int = 0) -> bytes:
    return msgspec.msgpack.Encoder().encode(
        KVEventBatch(ts=12.5, events=list(events), data_parallel_rank=rank)
    )


def test_a_store_keeps_tokens_hashes_and_multimodal_keys():
    event = stored(
        [2**64 - 1, 7],  # vLLM's low 64 bits, unsigned: the proto's int64 is signed
        list(range(8)),
        parent=5,
        extra_keys=[[("img-a", -3)], [("img-a", -7), ("img-b", 2), "salt"]],
        group_idx=0,
        kv_cache_spec_kind="full_attention",
    )
    batch = Normalizer().batch(encode(event, rank=1), seq=9, rank=1)
    assert (batch.sequence_number, batch.dp_rank, batch.timestamp) == (9, 1, 12.5)
    data = batch.events[0].stored
    assert [b.block_hash for b in data.blocks] == [-1, 7]
    assert data.parent_block_hash == 5
    assert [list(b.token_ids) for b in data.blocks] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert {b.block_size for b in data.blocks} == {BLOCK}
    assert (data.medium, data.tier) == ("GPU", common_pb2.KV_CACHE_TIER_DEVICE)
    assert data.locality == common_pb2.KV_CACHE_LOCALITY_LOCAL
    assert not data.blocks[0].HasField("cache_level")  # on the device
    keys = [[k.multimodal.identifier, k.multimodal.offset] for k in data.blocks[1].extra_keys[:2]]
    assert keys == [["img-a", -7], ["img-b", 2]]
    assert data.blocks[1].extra_keys[2].text == "salt"
    assert (data.group_idx, data.kv_cache_spec_kind) == (0, "full_attention")


def test_removals_clears_tiers_and_what_is_dropped():
    normalizer = Normalizer()
    payload = encode(
        stored([1], [1, 2, 3, 4], medium="CPU", extra_keys=[["tenant-salt"]]),
        stored([2], [1, 2, 3, 4], group_idx=1, kv_cache_spec_kind="sliding_window"),
        BlockRemoved(block_hashes=[2], medium="GPU", group_idx=1),  # learned: not main
        BlockRemoved(block_hashes=[1], medium="CPU"),
        stored([3], [1, 2, 3], medium="GPU"),  # 3 tokens for a block of 4
        stored([4], [1, 2, 3, 4], locality="REMOTE"),
        AllBlocksCleared(),
    )
    events = normalizer.batch(payload, seq=0, rank=0).events
    kinds = [e.WhichOneof("data") for e in events]
    assert kinds == ["stored", "removed", "cleared"]
    host = events[0].stored
    assert (host.tier, host.blocks[0].cache_level, host.cache_salt) == (
        common_pb2.KV_CACHE_TIER_HOST,
        1,
        "tenant-salt",
    )
    assert (list(events[1].removed.block_hashes), events[1].removed.cache_level) == ([1], 1)
    assert [e.event_id for e in events] == [1, 4, 7]  # one id per event, forwarded or not
    assert normalizer.dropped == {
        "non_main_attention_group": 2,
        "unaligned_blocks": 1,
        "non_local_locality": 1,
    }


def test_an_undecodable_payload_is_an_empty_batch_under_its_sequence():
    batch = Normalizer().batch(b"\xc1", seq=3, rank=0)
    assert (batch.sequence_number, list(batch.events)) == (3, [])


def test_endpoints_follow_vllms_offsets():
    assert kv_events.connectable("tcp://*:5557") == "tcp://127.0.0.1:5557"
    assert kv_events.connectable("tcp://0.0.0.0:5557", 2) == "tcp://127.0.0.1:5559"
    assert ZmqEventPublisher.offset_endpoint_port("tcp://*:5557", 2) == "tcp://*:5559"
    assert kv_events.connectable("inproc://kv", 1) == "inproc://kv_dp1"


# ---- streaming through sockets ----


@pytest.fixture
def publisher() -> Iterator[tuple[ZmqEventPublisher, str, str]]:
    # vLLM binds a wildcard endpoint and *connects* to any other tcp one (a broker's)
    port, replay = free_port(), f"tcp://127.0.0.1:{free_port()}"
    pub = ZmqEventPublisher(0, endpoint=f"tcp://*:{port}", replay_endpoint=replay, buffer_steps=100)
    yield pub, f"tcp://127.0.0.1:{port}", replay
    pub.shutdown()


def collect(sources, count: int, *, before=None, timeout: float = 10.0) -> list:
    """The first `count` batches the relay yields; `before()` runs once it has subscribed."""

    async def run() -> list:
        out: list = []
        done = asyncio.Event()

        async def ready():
            if before is not None:
                await asyncio.to_thread(before)

        async def consume():
            async for batch in relay(sources, stopped=done.is_set, poll_seconds=0.05, ready=ready):
                out.append(batch)
                if len(out) == count:
                    done.set()

        await asyncio.wait_for(consume(), timeout)
        return out

    return asyncio.run(run())


def test_live_batches_from_vllms_publisher(publisher):
    pub, endpoint, replay = publisher

    def publish():
        time.sleep(0.3)  # a SUB misses what is sent before its subscription lands
        pub.publish(KVEventBatch(ts=1.0, events=[stored([11], [1, 2, 3, 4])]))
        pub.publish(KVEventBatch(ts=2.0, events=[BlockRemoved(block_hashes=[11], medium="GPU")]))

    batches = collect([RankSource(0, endpoint, replay)], 2, before=publish)
    assert [b.sequence_number for b in batches] == [0, 1]
    assert batches[0].events[0].stored.blocks[0].block_hash == 11
    assert list(batches[1].events[0].removed.block_hashes) == [11]


def test_a_gap_is_filled_from_vllms_replay_endpoint(publisher):
    """The live stream (our own PUB) skips 1 and 2; the relay fetches them from the replay
    ROUTER of vLLM's publisher, which published all four."""
    pub, _, replay = publisher
    payloads = [KVEventBatch(ts=float(i), events=[stored([100 + i], [i] * 4)]) for i in range(4)]
    for batch in payloads:
        pub.publish(batch)
    ctx = zmq.Context.instance()
    live = ctx.socket(zmq.PUB)
    live_endpoint = f"tcp://127.0.0.1:{free_port()}"
    live.bind(live_endpoint)
    encoder = msgspec.msgpack.Encoder()

    def send_live():
        time.sleep(0.3)
        for seq in (0, 3):
            live.send_multipart([b"", seq.to_bytes(8, "big"), encoder.encode(payloads[seq])])

    try:
        batches = collect([RankSource(0, live_endpoint, replay)], 4, before=send_live)
    finally:
        live.close(linger=0)
    assert [b.sequence_number for b in batches] == [0, 1, 2, 3]
    assert [b.events[0].stored.blocks[0].block_hash for b in batches] == [100, 101, 102, 103]


def test_a_publisher_that_restarts_its_sequence_ends_the_stream():
    ctx = zmq.Context.instance()
    live = ctx.socket(zmq.PUB)
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    live.bind(endpoint)
    payload = encode(AllBlocksCleared())

    def send():
        time.sleep(0.3)
        for seq in (5, 2):
            live.send_multipart([b"", seq.to_bytes(8, "big"), payload])

    try:
        with pytest.raises(RelayFailure, match="restarted at 2 after 5"):
            collect([RankSource(0, endpoint)], 3, before=send)
    finally:
        live.close(linger=0)


def test_a_gap_without_a_replay_endpoint_ends_the_stream():
    ctx = zmq.Context.instance()
    live = ctx.socket(zmq.PUB)
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    live.bind(endpoint)
    payload = encode(AllBlocksCleared())

    def send():
        time.sleep(0.3)
        for seq in (0, 2):
            live.send_multipart([b"", seq.to_bytes(8, "big"), payload])

    try:
        with pytest.raises(RelayFailure, match="skipped from 0 to 2"):
            collect([RankSource(0, endpoint)], 3, before=send)
    finally:
        live.close(linger=0)
