"""Tensors through /dev/shm segments: written exclusively and privately, read back by the
worker's own reader as the inline bytes, chosen per worker (auto: same /dev/shm only), fresh
for every attempt and never left behind (read, failed, retried, abandoned).

Segments go to a temporary directory standing in for /dev/shm (the worker's reader is pointed
at it too), so these tests never touch the host's."""

from __future__ import annotations

import asyncio
import errno
import os
import stat
import threading
from contextlib import aclosing
from pathlib import Path

import grpc
import numpy as np
import pytest

from engine_server import model_info
from engine_server import tensors as worker_tensors
from gateway.observability.metrics import GatewayMetrics
from gateway.workers.retry import RetryingGenerate
from gateway.workers.tensor_transport import InlineTail, TensorTransport
from gateway.workers.worker import WorkerFacts
from multimodal import shm
from multimodal.pipeline import PixelEncoding
from multimodal.processors.base import ProcessedItems
from multimodal.wire import Field, flatten, multimodal_nodes
from protos import vllm_engine_pb2 as pb

MIB = 1 << 20
HERE = "boot-a:41"  # this "host"'s /dev/shm identity in these tests


def facts(namespace: str = HERE) -> WorkerFacts:
    return WorkerFacts(
        model_path="m",
        served_model_name="m",
        max_context_length=100,
        vocab_size=10,
        eos_token_ids=[],
        supports_vision=True,
        is_generation=True,
        pixels=PixelEncoding(raw=True),
        shm_namespace_id=namespace,
    )


def processed() -> ProcessedItems:
    rng = np.random.default_rng(3)
    return ProcessedItems(
        tensors={
            "pixel_values": rng.integers(0, 256, (1200, 1176), dtype=np.uint8),  # 1.3 MiB
            "video_grid_thw": np.array([[4, 20, 15]], dtype=np.int64),  # 24 bytes
        },
        flat_keys={"pixel_values": "video_grid_thw"},
        keep_on_cpu_keys=("video_grid_thw",),
    )


MM_INPUTS = pb.GenerateRequest.DESCRIPTOR.fields_by_name["mm_inputs"].number


def request_nodes() -> list:
    nodes = multimodal_nodes(processed(), [(2, 1200)], ["h" * 64], None, "video")
    return [Field(MM_INPUTS, nodes)]


def transport(tmp_path: Path, mode: str = "auto", **kwargs) -> TensorTransport:
    return TensorTransport(mode, shm_dir=str(tmp_path), namespace=HERE, **kwargs)  # type: ignore[arg-type]


def decoded(pieces, monkeypatch, shm_dir: Path) -> dict[str, np.ndarray]:
    """What the worker makes of a tail: every tensor, through its own reader."""
    monkeypatch.setattr(worker_tensors, "SHM_DIR", str(shm_dir))
    mm = pb.GenerateRequest.FromString(b"".join(pieces)).mm_inputs
    out = {"pixel_values": worker_tensors.tensor_from_proto(mm.pixel_values, "pv").numpy()}
    for key, td in mm.model_specific_tensors.items():
        out[key] = worker_tensors.tensor_from_proto(td, key).numpy()
    return out


def kinds(pieces) -> dict[str, str | None]:
    mm = pb.GenerateRequest.FromString(b"".join(pieces)).mm_inputs
    found = {"pixel_values": mm.pixel_values.WhichOneof("payload")}
    for key, td in mm.model_specific_tensors.items():
        found[key] = td.WhichOneof("payload")
    return found


# ---- segments ----


def test_a_segment_is_private_exclusive_and_unguessable(tmp_path):
    data = np.arange(1000, dtype=np.uint16)
    name = shm.write_segment(memoryview(data).cast("B"), str(tmp_path))
    path = tmp_path / name
    assert name.startswith("mmgate-") and len(name) == len("mmgate-") + 32
    assert path.read_bytes() == data.tobytes()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert shm.segment_name() != shm.segment_name()
    assert shm.unlink_segment(name, str(tmp_path)) is True
    assert shm.unlink_segment(name, str(tmp_path)) is False  # gone: the worker read it


def test_a_failed_write_leaves_nothing(tmp_path, monkeypatch):
    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shm.os, "write", full)
    with pytest.raises(OSError):
        shm.write_segment(b"x" * 100, str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_the_engine_advertises_the_namespace_the_gateway_computes():
    # One function serves both sides, so a gateway and an engine on one host always agree.
    assert model_info.shm_namespace_id is shm.shm_namespace_id
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip()
    assert shm.shm_namespace_id() == f"{boot}:{os.stat('/dev/shm').st_dev}"
    assert shm.shm_namespace_id(boot_id="/nonexistent") == ""


# ---- the choice per worker ----


def test_auto_uses_shm_only_for_a_worker_sharing_our_dev_shm(tmp_path):
    auto = transport(tmp_path)
    assert auto.uses_shm(facts(HERE))
    assert not auto.uses_shm(facts("boot-b:41"))  # another host (or container's tmpfs)
    assert not auto.uses_shm(facts(""))  # a worker that does not say
    assert not auto.uses_shm(None)
    assert not TensorTransport("auto", shm_dir=str(tmp_path), namespace="").uses_shm(facts(""))
    assert transport(tmp_path, "shm").uses_shm(facts("boot-b:41"))  # the operator asserts it
    assert not transport(tmp_path, "inline").uses_shm(facts(HERE))


def test_auto_sends_inline_to_a_worker_in_another_namespace(tmp_path, monkeypatch):
    nodes = request_nodes()
    inline = flatten(nodes)
    attempt = asyncio.run(transport(tmp_path).tail(nodes, inline).attempt(facts("boot-b:41")))
    assert attempt.pieces is inline and attempt.segments == []
    assert list(tmp_path.iterdir()) == []
    assert kinds(attempt.pieces) == {"pixel_values": "inline", "video_grid_thw": "inline"}


def test_a_shared_worker_reads_the_same_tensors_from_segments(tmp_path, monkeypatch):
    metrics = GatewayMetrics()
    nodes = request_nodes()
    want = decoded(flatten(nodes), monkeypatch, tmp_path)
    attempt = asyncio.run(transport(tmp_path, metrics=metrics).tail(nodes, []).attempt(facts()))
    # only the tensor past the threshold goes through a segment
    assert kinds(attempt.pieces) == {"pixel_values": "shm", "video_grid_thw": "inline"}
    assert [p.name for p in tmp_path.iterdir()] == attempt.segments
    got = decoded(attempt.pieces, monkeypatch, tmp_path)
    assert want.keys() == got.keys()
    for key in want:
        assert np.array_equal(got[key], want[key]), key
    assert list(tmp_path.iterdir()) == []  # the worker unlinked what it read
    attempt.close()  # and the gateway's cleanup finds nothing left, without error
    size = processed().tensors["pixel_values"].nbytes
    assert metrics.registry.get_sample_value("mmgate_shm_bytes_total") == size


def test_small_tensors_alone_stay_inline(tmp_path):
    nodes = request_nodes()
    inline = flatten(nodes)
    tail = transport(tmp_path, min_bytes=2 * MIB).tail(nodes, inline)
    assert isinstance(tail, InlineTail)
    assert isinstance(transport(tmp_path, "inline").tail(nodes, inline), InlineTail)


def test_a_failed_segment_goes_inline_and_is_counted(tmp_path, monkeypatch):
    metrics = GatewayMetrics()
    nodes = request_nodes()
    monkeypatch.setattr(
        "gateway.workers.tensor_transport.write_segment",
        lambda data, shm_dir: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")),
    )
    attempt = asyncio.run(transport(tmp_path, metrics=metrics).tail(nodes, []).attempt(facts()))
    assert kinds(attempt.pieces)["pixel_values"] == "inline"
    assert metrics.registry.get_sample_value("mmgate_shm_write_failures_total") == 1
    got = decoded(attempt.pieces, monkeypatch, tmp_path)
    assert np.array_equal(got["pixel_values"], processed().tensors["pixel_values"])


def test_an_attempt_abandoned_while_writing_leaves_nothing(tmp_path, monkeypatch):
    """The client leaves while the segments are being written: the writing thread cannot be
    stopped, so what it wrote is unlinked once it is done."""
    started, release = threading.Event(), threading.Event()
    write = shm.write_segment

    def slow(data, shm_dir):
        name = write(data, shm_dir)
        started.set()
        release.wait(5)
        return name

    monkeypatch.setattr("gateway.workers.tensor_transport.write_segment", slow)

    async def scenario() -> None:
        task = asyncio.create_task(transport(tmp_path).tail(request_nodes(), []).attempt(facts()))
        await asyncio.to_thread(started.wait, 5)
        assert len(list(tmp_path.iterdir())) == 1  # written, not yet handed to anyone
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()
        for _ in range(200):  # the thread finishes, then its segments go
            if not list(tmp_path.iterdir()):
                return
            await asyncio.sleep(0.01)

    asyncio.run(scenario())
    assert list(tmp_path.iterdir()) == []


# ---- attempts: a retry gets its own segments, every attempt's are unlinked ----


class FakeWorker:
    """A worker that records the segments each call named, then reads them (as the real one
    does, unlinking) or fails before reading, or streams until the consumer leaves."""

    def __init__(self, url: str, shm_dir: Path, behaviour: str) -> None:
        self.url, self.shm_dir, self.behaviour = url, shm_dir, behaviour
        self.facts = facts()
        self.seen: list[list[str]] = []

    def record_call(self, error) -> None:
        pass

    async def generate(self, request, tail, metadata=()):
        mm = pb.GenerateRequest.FromString(b"".join([request.SerializeToString(), *tail]))
        names = [mm.mm_inputs.pixel_values.shm.name]
        assert all((self.shm_dir / n).is_file() for n in names)  # written before the call
        self.seen.append(names)
        if self.behaviour == "dies":  # before reading anything
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "gone"
            )
        if self.behaviour == "reads":
            for name in names:
                os.unlink(self.shm_dir / name)
        yield pb.GenerateResponse(chunk=pb.GenerateStreamChunk(token_ids=[1]))
        if self.behaviour == "slow":
            await asyncio.sleep(60)
        yield pb.GenerateResponse(complete=pb.GenerateComplete(finish_reason="stop"))


def test_a_retry_gets_fresh_segments_and_none_are_left(tmp_path):
    first = FakeWorker("a", tmp_path, "dies")
    second = FakeWorker("b", tmp_path, "reads")
    tail = transport(tmp_path).tail(request_nodes(), [])
    call = RetryingGenerate(first, pb.GenerateRequest(request_id="r"), tail, lambda f: second)  # type: ignore[arg-type]

    async def run() -> list:
        return [r async for r in call.responses()]

    assert len(asyncio.run(run())) == 2
    assert first.seen and second.seen and set(first.seen[0]).isdisjoint(second.seen[0])
    assert list(tmp_path.iterdir()) == []  # the dead worker's segments were unlinked too


def test_a_client_leaving_mid_stream_leaves_no_segments(tmp_path):
    """The worker has not read its segments (it never does in this fake) when the consumer
    stops: closing the stream unlinks them."""
    worker = FakeWorker("a", tmp_path, "slow")
    tail = transport(tmp_path).tail(request_nodes(), [])
    call = RetryingGenerate(worker, pb.GenerateRequest(request_id="r"), tail)  # type: ignore[arg-type]

    async def run() -> None:
        async with aclosing(call.responses()) as responses:
            async for _ in responses:
                assert len(list(tmp_path.iterdir())) == 1
                break

    asyncio.run(run())
    assert list(tmp_path.iterdir()) == []
