"""The worker's service surface: info RPCs, tokenizer bundle, health, cancellation, drain."""

from __future__ import annotations

import hashlib
import io
import threading
import time
import zipfile

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from protos import common_pb2
from protos import vllm_engine_pb2 as pb
from tests.support.engines import MAX_MODEL_LEN, WorkerProcess


def long_stream(stub, request_id: str, max_tokens: int = 600):
    return stub.Generate(
        pb.GenerateRequest(
            request_id=request_id,
            tokenized=pb.TokenizedInput(input_ids=[11, 12, 13]),
            sampling_params=pb.SamplingParams(
                temperature=0.0, max_tokens=max_tokens, ignore_eos=True
            ),
            stream=True,
        ),
        timeout=120,
    )


def wait_until(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_model_info_has_every_field_smg_reads(text_worker, text_model):
    info = text_worker.stub().GetModelInfo(pb.GetModelInfoRequest())
    assert info.model_path == info.tokenizer_path == str(text_model)
    assert info.served_model_name == str(text_model)
    assert info.is_generation and not info.supports_vision
    assert info.model_type == "qwen2" and list(info.architectures) == ["Qwen2ForCausalLM"]
    assert info.max_context_length == info.max_req_input_len == MAX_MODEL_LEN
    assert info.vocab_size == 3007
    assert list(info.eos_token_ids) == [3002, 3000]  # config's eos, then generation_config's
    assert info.bos_token_id == info.pad_token_id == 3000


def test_server_info_is_live(text_worker):
    stub = text_worker.stub()
    before = stub.GetServerInfo(pb.GetServerInfoRequest())
    assert before.server_type == "vllm-grpc" and before.uptime_seconds > 0
    assert before.max_num_seqs > 0 and before.block_size > 0
    assert before.model_dtype == "torch.float32" and not before.is_paused
    stream = long_stream(stub, "live-1")
    next(stream)
    during = stub.GetServerInfo(pb.GetServerInfoRequest())
    assert during.active_requests == 1
    assert during.last_receive_timestamp > before.last_receive_timestamp
    assert during.uptime_seconds > before.uptime_seconds
    stream.cancel()


def test_client_that_goes_away_aborts_its_request(text_worker):
    stub = text_worker.stub()
    stream = long_stream(stub, "gone-1")
    next(stream)
    assert stub.GetLoads(pb.GetLoadsRequest()).loads[0].num_total_reqs >= 1
    stream.cancel()
    # The engine itself has let go of the request, not just our RPC bookkeeping.
    assert wait_until(lambda: stub.GetLoads(pb.GetLoadsRequest()).loads[0].num_total_reqs == 0)
    assert stub.GetServerInfo(pb.GetServerInfoRequest()).active_requests == 0


def test_abort_rpc_stops_a_running_request(text_worker):
    stub = text_worker.stub()
    stream = long_stream(stub, "abort-me")
    next(stream)
    stub.Abort(pb.AbortRequest(request_ids=["abort-me"]))
    rest = list(stream)
    tokens = sum(len(r.chunk.token_ids) for r in rest if r.HasField("chunk"))
    assert tokens < 590, "the request stopped long before max_tokens"
    assert wait_until(lambda: stub.GetLoads(pb.GetLoadsRequest()).loads[0].num_total_reqs == 0)


def test_loads_report_one_rank(text_worker):
    loads = text_worker.stub().GetLoads(pb.GetLoadsRequest())
    assert loads.dp_rank_count == 1 and len(loads.loads) == 1
    assert loads.version and loads.timestamp
    assert loads.loads[0].max_total_num_tokens > 0


def test_tokenizer_bundle_streams_a_verified_zip(text_worker, text_model):
    chunks = list(text_worker.stub().GetTokenizer(common_pb2.GetTokenizerRequest()))
    assert all(len(c.data) <= 64 * 1024 for c in chunks)
    assert all(not c.sha256 for c in chunks[:-1]) and chunks[-1].sha256
    data = b"".join(c.data for c in chunks)
    assert hashlib.sha256(data).hexdigest() == chunks[-1].sha256
    names = set(zipfile.ZipFile(io.BytesIO(data)).namelist())
    assert {"tokenizer.json", "tokenizer_config.json", "config.json"} <= names
    assert {"generation_config.json", "chat_template.jinja"} <= names
    original = (text_model / "tokenizer.json").read_bytes()
    assert zipfile.ZipFile(io.BytesIO(data)).read("tokenizer.json") == original


def test_standard_health_and_reflection(text_worker):
    channel = grpc.insecure_channel(text_worker.address)
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "vllm.grpc.engine.VllmEngine"):
        status = health.Check(health_pb2.HealthCheckRequest(service=service)).status
        assert status == health_pb2.HealthCheckResponse.SERVING
    reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    (reply,) = list(reflection.ServerReflectionInfo(iter([request])))
    names = {s.name for s in reply.list_services_response.service}
    assert {"vllm.grpc.engine.VllmEngine", "grpc.health.v1.Health"} <= names


def test_kv_events_relay_the_engines_block_stores(text_worker):
    """A prompt's full blocks come out of SubscribeKvEvents as vLLM stored them: its token ids
    per block, the engine's block size, device tier, rank 0, publisher sequence numbers."""
    stub = text_worker.stub()
    block = stub.GetServerInfo(pb.GetServerInfoRequest()).block_size
    ids = list(range(200, 200 + 2 * block + 5))
    stream = stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest(), timeout=60)
    stream.initial_metadata()  # subscribed: what the engine stores from now on is relayed
    request = pb.GenerateRequest(
        request_id="kv-events",
        tokenized=pb.TokenizedInput(input_ids=ids),
        sampling_params=pb.SamplingParams(temperature=0.0, max_tokens=1),
    )
    list(stub.Generate(request))
    stored = []
    for batch in stream:
        assert batch.dp_rank == 0
        stored += [e.stored for e in batch.events if e.WhichOneof("data") == "stored"]
        blocks = [list(b.token_ids) for s in stored for b in s.blocks]
        if ids[: 2 * block] in [blocks[i] + blocks[i + 1] for i in range(len(blocks) - 1)]:
            break
    stream.cancel()
    last = stored[-1]
    assert {b.block_size for b in last.blocks} == {block}
    assert (last.tier, last.medium) == (common_pb2.KV_CACHE_TIER_DEVICE, "GPU")  # even on CPU
    assert last.kv_cache_spec_kind == "full_attention"


def test_kv_events_cannot_resume_a_cursor(text_worker):
    request = common_pb2.SubscribeKvEventsRequest(start_sequence_number=5)
    with pytest.raises(grpc.RpcError) as err:
        list(text_worker.stub().SubscribeKvEvents(request, timeout=30))
    assert err.value.code() == grpc.StatusCode.OUT_OF_RANGE


def test_prompt_limits_follow_vllm(text_worker):
    stub = text_worker.stub()
    long_ids = [11] * (MAX_MODEL_LEN + 10)
    with pytest.raises(grpc.RpcError) as err:
        list(
            stub.Generate(
                pb.GenerateRequest(
                    tokenized=pb.TokenizedInput(input_ids=long_ids),
                    sampling_params=pb.SamplingParams(max_tokens=4),
                )
            )
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    (done,) = [
        r.complete
        for r in stub.Generate(
            pb.GenerateRequest(
                tokenized=pb.TokenizedInput(input_ids=list(range(10, 60))),
                sampling_params=pb.SamplingParams(max_tokens=2, truncate_prompt_tokens=10),
            )
        )
    ]
    assert done.prompt_tokens == 10


def test_sigterm_drains_in_flight_requests(text_model, tmp_path):
    worker = WorkerProcess(text_model, tmp_path / "drain.log").wait_ready()
    try:
        stream = long_stream(worker.stub(), "drain-1", max_tokens=300)
        first = next(stream)
        received: list = [first]
        reader = threading.Thread(target=lambda: received.extend(stream))
        reader.start()
        worker.proc.send_signal(15)
        reader.join(timeout=120)
        tokens = sum(len(r.chunk.token_ids) for r in received if r.HasField("chunk"))
        assert tokens == 300 and received[-1].complete.finish_reason == "length"
        assert worker.proc.wait(timeout=60) == 0
    finally:
        worker.stop()


def test_cached_prompt_tokens_are_reported(text_worker):
    stub = text_worker.stub()
    block = stub.GetServerInfo(pb.GetServerInfoRequest()).block_size
    ids = list(range(100, 100 + 3 * block))

    def run(request_id: str) -> pb.GenerateComplete:
        request = pb.GenerateRequest(
            request_id=request_id,
            tokenized=pb.TokenizedInput(input_ids=ids),
            sampling_params=pb.SamplingParams(temperature=0.0, max_tokens=2),
        )
        (done,) = [r.complete for r in stub.Generate(request)]
        return done

    run("cache-warm")
    assert run("cache-hit").cached_tokens >= 2 * block
