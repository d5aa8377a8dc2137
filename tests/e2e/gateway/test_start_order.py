"""Any start order: gateways started before their worker answer 503 at once and become ready
when it comes up (model files from the directory or from the worker's bundle), survive its
death and serve again when it comes back at the same address; a worker serving another model
is refused, logged and counted, and never routed to."""

from __future__ import annotations

import time

import httpx
import pytest

from gateway.server.routes import WAITING
from tests.support.engines import WorkerProcess, free_port
from tests.support.gateway_process import GatewayProcess

FAST_CHECKS = ("--health-interval", "0.5", "--health-fall", "1", "--health-rise", "1")
HELLO = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise TimeoutError(what)


def status(gateway: GatewayProcess, path: str) -> int:
    try:
        return httpx.get(gateway.base_url + path, timeout=5).status_code
    except httpx.HTTPError:
        return 0


def chat(gateway: GatewayProcess, model: str) -> httpx.Response:
    body = {**HELLO, "model": model, "temperature": 0}
    return httpx.post(f"{gateway.base_url}/v1/chat/completions", json=body, timeout=120)


@pytest.fixture(scope="module")
def waiting(text_model, tmp_path_factory):
    """Two gateways (model dir; model name only, files from the worker's bundle) started
    before the worker they point at, and that worker's port."""
    logs = tmp_path_factory.mktemp("start-order")
    port = free_port()
    worker = f"127.0.0.1:{port}"
    by_dir = GatewayProcess(text_model, [worker], logs / "by-dir.log", *FAST_CHECKS)
    by_name = GatewayProcess("tiny-text", [worker], logs / "by-name.log", *FAST_CHECKS)
    try:
        for gateway in (by_dir, by_name):
            wait_for(lambda g=gateway: status(g, "/health") == 200, 60, "gateway up")
        by_dir.model, by_name.model = str(text_model), "tiny-text"  # the names they serve
        yield by_dir, by_name, port, logs
    finally:
        by_dir.stop()
        by_name.stop()


def test_before_any_worker_the_gateway_is_live_not_ready_and_answers_503(waiting):
    by_dir, by_name, _, _ = waiting
    for gateway in (by_dir, by_name):
        assert gateway.proc.poll() is None  # it did not exit
        ready = httpx.get(gateway.base_url + "/ready", timeout=5)
        assert ready.status_code == 503
        assert ready.json()["error"]["message"] == WAITING
        started = time.monotonic()
        reply = chat(gateway, gateway.model)
        assert time.monotonic() - started < 2  # at once, not after a timeout
        assert reply.status_code == 503
        assert reply.json()["error"]["message"] == WAITING
        tokenized = httpx.post(gateway.base_url + "/tokenize", json={"prompt": "hi"}, timeout=5)
        assert tokenized.status_code == 503
        assert status(gateway, "/v1/models") == 200
    assert "answering 503 until one does" in by_dir.log_path.read_text()


def test_the_first_worker_to_answer_makes_them_ready_and_a_restart_is_survived(waiting, text_model):
    by_dir, by_name, port, logs = waiting
    # Served under the name the by-name gateway was given, as a deployment would.
    serving = {"served_model_name": "tiny-text"}
    worker = WorkerProcess(text_model, logs / "worker.log", port=port, **serving)
    try:
        worker.wait_ready()
        for gateway in (by_dir, by_name):
            gateway.wait_ready(timeout=60)
        first = chat(by_dir, by_dir.model)
        assert first.status_code == 200, first.text
        named = chat(by_name, by_name.model)
        assert named.status_code == 200, named.text
        # the same tokenizer and template, from the directory and from the bundle
        assert named.json()["choices"][0]["message"] == first.json()["choices"][0]["message"]
        assert named.json()["usage"] == first.json()["usage"]

        worker.kill()  # the pod dies...
        for gateway in (by_dir, by_name):
            wait_for(lambda g=gateway: status(g, "/ready") == 503, 30, "not ready")
            assert chat(gateway, gateway.model).status_code == 503
            assert status(gateway, "/health") == 200
    finally:
        worker.stop()
    worker = WorkerProcess(text_model, logs / "worker-again.log", port=port, **serving)  # ...back
    try:
        worker.wait_ready()
        for gateway in (by_dir, by_name):
            gateway.wait_ready(timeout=60)
        again = chat(by_dir, by_dir.model)
        assert again.status_code == 200, again.text
        assert again.json()["choices"][0]["message"] == first.json()["choices"][0]["message"]
    finally:
        worker.stop()


def metric(gateway: GatewayProcess, line_start: str) -> float | None:
    text = httpx.get(gateway.base_url + "/metrics", timeout=5).text
    for line in text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_a_worker_serving_another_model_is_refused(text_model, text_worker, tmp_path):
    other = WorkerProcess(text_model, tmp_path / "other.log", served_model_name="another-model")
    gateway = None
    try:
        other.wait_ready()
        workers = [text_worker.address, other.address]
        gateway = GatewayProcess(text_model, workers, tmp_path / "gateway.log", *FAST_CHECKS)
        gateway.wait_ready()
        listing = httpx.get(gateway.base_url + "/admin/workers", timeout=5).json()["workers"]
        state = {w["url"]: w for w in listing}
        refused = state[f"grpc://{other.address}"]
        assert refused["eligible"] is False
        assert "serves 'another-model'" in refused["refused"]
        assert state[f"grpc://{text_worker.address}"]["refused"] == ""
        assert metric(gateway, 'mmgate_worker_refused{worker="grpc://' + other.address) == 1.0
        assert metric(gateway, 'mmgate_workers_refused_total{reason="other_model"}') == 1.0
        log = gateway.log_path.read_text()
        assert f"worker grpc://{other.address} refused: it serves 'another-model'" in log
        for _ in range(4):  # round robin would alternate: every request goes to the one
            assert chat(gateway, str(text_model)).status_code == 200
        listing = httpx.get(gateway.base_url + "/admin/workers", timeout=5).json()["workers"]
        served = {w["url"]: w["requests_total"] for w in listing}
        assert served[f"grpc://{other.address}"] == 0
        assert served[f"grpc://{text_worker.address}"] >= 4
    finally:
        if gateway is not None:
            gateway.stop()
        other.stop()
