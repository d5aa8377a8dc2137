"""Traces: a client's W3C traceparent continues through the gateway's spans (parse, queue,
render, media fetch, preprocess, worker call, stream) and, in the Generate call's gRPC
metadata, into the engine worker's spans and vLLM's own, all received by a real OTLP
collector (the OpenTelemetry SDK's exporters sending to tests/support/otlp.py)."""

from __future__ import annotations

import httpx
import pytest

from tests.support.e2e_cases import IMAGE, png_bytes
from tests.support.engines import WorkerProcess
from tests.support.gateway_process import GatewayProcess
from tests.support.http_files import serve_bytes
from tests.support.otlp import Collector

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
GATEWAY_STAGES = {
    "POST /v1/chat/completions",
    "mmgate.parse",
    "mmgate.queue",
    "mmgate.render",
    "mmgate.media.fetch",
    "mmgate.preprocess",
    "mmgate.worker.generate",
    "mmgate.stream",
}
ENGINE_SPANS = {"mmgate.engine.generate", "mmgate.engine.prepare", "llm_request"}


@pytest.fixture(scope="module")
def collector():
    collector = Collector()
    yield collector
    collector.stop()


@pytest.fixture(scope="module")
def traced(vision_model, collector, tmp_path_factory, monkeypatch_module):
    # Export within 0.1 s of a span's end rather than the SDK's default 5 s.
    monkeypatch_module.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    logs = tmp_path_factory.mktemp("traced")
    worker = WorkerProcess(
        vision_model, logs / "worker.log", otlp_traces_endpoint=collector.endpoint
    )
    gateway = None
    try:
        worker.wait_ready()
        flags = ["--otlp-traces-endpoint", collector.endpoint]
        flags += ["--allow-private-media-networks", "127.0.0.0/8"]
        gateway = GatewayProcess(vision_model, [worker.address], logs / "gateway.log", *flags)
        yield gateway.wait_ready(), worker.address
    finally:
        if gateway is not None:
            gateway.stop()
        worker.stop()


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_one_trace_from_the_client_through_the_engine(traced, collector, vision_model):
    gateway, worker_address = traced
    with serve_bytes(png_bytes(IMAGE)) as base:
        body = {
            "model": str(vision_model),
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": f"{base}/cat.png"}},
                        {"type": "text", "text": "Describe."},
                    ],
                }
            ],
            "max_tokens": 4,
            "stream": True,
        }
        headers = {"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"}
        reply = httpx.post(
            f"{gateway.base_url}/v1/chat/completions", json=body, headers=headers, timeout=120
        )
    assert reply.status_code == 200 and "[DONE]" in reply.text
    spans = collector.wait_for(GATEWAY_STAGES | ENGINE_SPANS, TRACE_ID)
    by_name = {s.name: s for s in spans}
    assert set(by_name) >= GATEWAY_STAGES | ENGINE_SPANS, sorted(by_name)

    server = by_name["POST /v1/chat/completions"]
    assert server.parent_id == CLIENT_SPAN  # the client's trace, continued
    assert server.service == "mmgate-gateway"
    assert server.attributes["http.response.status_code"] == 200
    for stage in GATEWAY_STAGES - {server.name}:
        assert by_name[stage].parent_id == server.span_id, stage
    call = by_name["mmgate.worker.generate"]
    assert call.attributes["worker.url"] == f"grpc://{worker_address}"
    engine = by_name["mmgate.engine.generate"]
    assert engine.parent_id == call.span_id  # across the gRPC call
    assert engine.service != "mmgate-gateway"
    assert by_name["mmgate.engine.prepare"].parent_id == engine.span_id
    assert by_name["llm_request"].parent_id == engine.span_id  # vLLM's own span
