"""`mmgate serve --api-server-count 2`: two processes on one port behave as one gateway.

In front of benchmarks/mock_worker.py (a VllmEngine with no model: what is tested here is the
gateway's processes, not generation, and a mock starts in a second, not a vLLM engine's ten):
/metrics counts every process's requests once, /admin/workers changes reach every process,
a conversation stays on its worker whichever process takes each turn, a stored response is
found and continued through every process, a killed process is
restarted with its admission slots given back, admission bounds the whole gateway, and
SIGTERM finishes every open stream before the gateway exits 0. The existing gateway suites
run against real engines with MMGATE_TEST_API_SERVER_COUNT=2 (see README)."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.gateway_process import GatewayProcess
from tests.support.mock_worker import MockWorker


@pytest.fixture(scope="module")
def mocks(text_model, tmp_path_factory) -> Iterator[tuple[MockWorker, MockWorker]]:
    logs = tmp_path_factory.mktemp("mock-workers")
    fast = MockWorker(text_model, logs / "fast.log", "--output-tokens", "4")
    # 20 streamed tokens 50 ms apart: a stream stays open about a second
    slow = MockWorker(
        text_model, logs / "slow.log", "--output-tokens", "20", "--token-interval", "0.05"
    )
    yield fast, slow
    fast.stop()
    slow.stop()


@pytest.fixture(scope="module")
def gateway(text_model, mocks, tmp_path_factory) -> Iterator[GatewayProcess]:
    log = tmp_path_factory.mktemp("gw-processes") / "gateway.log"
    extra = ["--api-server-count", "2", "--policy", "cache_aware"]
    proc = GatewayProcess(text_model, [mocks[0].url.removeprefix("grpc://")], log, *extra)
    yield proc.wait_ready()
    proc.stop()


def metrics(gateway: GatewayProcess) -> dict[tuple[str, tuple], float]:
    text = httpx.get(f"{gateway.base_url}/metrics", timeout=10).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def chat(gateway: GatewayProcess, content: str, stream: bool = False) -> httpx.Response:
    body = {
        "model": model_name(gateway),
        "messages": [{"role": "user", "content": content}],
        "stream": stream,
    }
    # A new connection each time: the kernel hands it to either process.
    return httpx.post(f"{gateway.base_url}/v1/chat/completions", json=body, timeout=30)


def model_name(gateway: GatewayProcess) -> str:
    if not hasattr(gateway, "model_name"):
        models = httpx.get(f"{gateway.base_url}/v1/models", timeout=10).json()
        gateway.model_name = models["data"][0]["id"]
    return gateway.model_name


def served_by(gateway: GatewayProcess) -> set[str]:
    """The processes that wrote an access line for a chat request."""
    text = gateway.log_path.read_text()
    return set(re.findall(r"POST /v1/chat/completions 200 .*gateway_process=(\d)", text))


def _log(gateway: GatewayProcess) -> str:
    return gateway.log_path.read_text()


def _admin_lines(gateway: GatewayProcess, index: str) -> int:
    return len(re.findall(rf"GET /admin/workers 200 .*gateway_process={index}\b", _log(gateway)))


def children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    found = []
    for child in map(int, text.split()):
        if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
            found.append(child)  # (not multiprocessing's resource tracker)
    return found


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise TimeoutError(what)


CHAT_200 = ("mmgate_requests_total", (("route", "/v1/chat/completions"), ("status", "200")))


def test_metrics_count_every_process_requests_once(gateway):
    before = metrics(gateway).get(CHAT_200, 0)
    for i in range(30):
        assert chat(gateway, f"count me {i}").status_code == 200
    wait_for(lambda: len(served_by(gateway)) == 2, 5, "both processes serving")
    assert metrics(gateway)[CHAT_200] - before == 30
    # /admin/workers counts for the whole gateway too, whichever process answers
    for _ in range(6):
        listing = httpx.get(f"{gateway.base_url}/admin/workers", timeout=10).json()
        (worker,) = listing["workers"]
        assert worker["requests_total"] == metrics(gateway)[CHAT_200]


def test_a_worker_added_or_removed_through_one_process_changes_them_all(gateway, mocks):
    url = mocks[1].url
    added = httpx.post(f"{gateway.base_url}/admin/workers", json={"url": url}, timeout=30)
    assert added.status_code == 201

    def everyone_lists(predicate) -> bool:
        # 12 new connections: both processes answer some (each lists its own pool)
        views = [httpx.get(f"{gateway.base_url}/admin/workers", timeout=10) for _ in range(12)]
        return all(predicate({w["url"]: w for w in v.json()["workers"]}) for v in views)

    wait_for(lambda: everyone_lists(lambda ws: url in ws and ws[url]["healthy"]), 10, "added")
    removed = httpx.request(
        "DELETE", f"{gateway.base_url}/admin/workers", json={"url": url}, timeout=30
    )
    assert removed.status_code == 202
    wait_for(lambda: everyone_lists(lambda ws: url not in ws), 10, "removed everywhere")


def test_a_conversation_stays_on_its_worker_whichever_process_takes_it(gateway, mocks):
    url = mocks[1].url
    httpx.post(f"{gateway.base_url}/admin/workers", json={"url": url}, timeout=30)
    try:
        wait_for(lambda: metrics(gateway).get(_healthy(url)) == 1, 10, "second worker healthy")
        for conversation in range(6):
            first = f"conversation {conversation}: " + "tell me about the sea " * 12
            workers = []
            for turn in range(5):
                before = _per_worker(gateway)
                assert chat(gateway, first + "and more " * turn).status_code == 200
                after = _per_worker(gateway)
                workers += [w for w in after if after[w] != before.get(w, 0)]
            assert len(set(workers)) == 1, (conversation, workers)
        assert served_by(gateway) == {"0", "1"}
    finally:
        httpx.request("DELETE", f"{gateway.base_url}/admin/workers", json={"url": url})


def test_a_stored_response_is_found_through_every_process(gateway):
    """One response store for the gateway: a response one process stored is read, and
    continued, through either; /metrics counts the store once, not once per process."""

    def create(text: str, previous: str | None = None) -> httpx.Response:
        body = {"model": model_name(gateway), "input": text, "max_output_tokens": 4, "store": True}
        if previous is not None:
            body["previous_response_id"] = previous
        return httpx.post(f"{gateway.base_url}/v1/responses", json=body, timeout=30)

    def answered(method: str, path: str) -> set[str]:
        pattern = rf"{method} {re.escape(path)} 200 .*gateway_process=(\d)"
        return set(re.findall(pattern, _log(gateway)))

    first = create("remember the sea")
    assert first.status_code == 200, first.text
    stored = first.json()
    path = f"/v1/responses/{stored['id']}"
    for _ in range(16):  # new connections: both processes answer some
        found = httpx.get(f"{gateway.base_url}{path}", timeout=10)
        assert found.status_code == 200, found.text
        assert found.json()["output"] == stored["output"]
    wait_for(lambda: answered("GET", path) == {"0", "1"}, 5, "both processes reading it")

    continued = []
    # which process accepts a new connection is the kernel's choice, and a loaded machine can
    # hand one process many in a row: go on (up to 32 turns) until both have continued it
    for turn in range(32):
        reply = create(f"and then {turn}", previous=stored["id"])
        assert reply.status_code == 200, reply.text
        continued.append(reply.json()["id"])
        items = httpx.get(f"{gateway.base_url}/v1/responses/{continued[-1]}/input_items")
        assert items.status_code == 200, items.text
        if turn >= 7 and answered("POST", "/v1/responses") == {"0", "1"}:
            break
    wait_for(lambda: answered("POST", "/v1/responses") == {"0", "1"}, 5, "both continuing")

    entries = metrics(gateway)[("mmgate_responses_store_entries", ())]
    assert entries == 1 + len(continued)


def _healthy(url: str) -> tuple[str, tuple]:
    return ("mmgate_worker_healthy", (("worker", url),))


def _per_worker(gateway: GatewayProcess) -> dict[str, float]:
    return {
        dict(labels)["worker"]: value
        for (name, labels), value in metrics(gateway).items()
        if name == "mmgate_worker_requests_total"
    }


def test_a_killed_process_is_restarted_and_its_slots_given_back(gateway, mocks):
    pids = children(gateway.proc.pid)
    assert len(pids) == 2
    added = mocks[1].url  # a runtime change the restarted process must be given
    httpx.post(f"{gateway.base_url}/admin/workers", json={"url": added}, timeout=30)
    # a stream in flight in each process, then one process killed under it
    streams = [threading.Thread(target=chat, args=(gateway, f"s{i}", True)) for i in range(6)]
    for thread in streams:
        thread.start()
    os.kill(pids[0], signal.SIGKILL)
    for thread in streams:
        thread.join()
    wait_for(lambda: len(children(gateway.proc.pid)) == 2, 20, "a new process")
    assert pids[0] not in children(gateway.proc.pid)
    wait_for(lambda: httpx.get(f"{gateway.base_url}/ready").status_code == 200, 30, "ready")
    assert "exited with -9" in gateway.log_path.read_text()
    for i in range(10):
        assert chat(gateway, f"after {i}").status_code == 200
    wait_for(lambda: metrics(gateway)[("mmgate_admitted_requests", ())] == 0, 5, "slots free")
    (index,) = re.findall(rf"gateway process (\d) started \(pid {pids[0]}\)", _log(gateway))
    answered = _admin_lines(gateway, index)
    for _ in range(50):  # until the restarted process has answered some
        view = httpx.get(f"{gateway.base_url}/admin/workers", timeout=10)
        assert added in {w["url"] for w in view.json()["workers"]}
        if _admin_lines(gateway, index) > answered:
            break
        time.sleep(0.1)  # (its access lines are written every 0.1 s)
    else:
        raise AssertionError("the restarted process answered none of 50 requests")
    httpx.request("DELETE", f"{gateway.base_url}/admin/workers", json={"url": added})


def test_admission_bounds_the_gateway_and_sigterm_finishes_every_stream(
    text_model, mocks, tmp_path
):
    slow = mocks[1].url.removeprefix("grpc://")
    extra = ["--api-server-count", "2", "--max-in-flight", "2", "--max-queue", "2"]
    gateway = GatewayProcess(text_model, [slow], tmp_path / "gateway.log", *extra).wait_ready()
    try:
        results: list[tuple[int, str]] = []

        def stream(i: int) -> None:
            response = chat(gateway, f"stream {i}", stream=True)
            results.append((response.status_code, response.text))

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(6)]
        for thread in threads:
            thread.start()
        # 2 streaming and 2 waiting gateway-wide (2 per process would admit all 6)
        wait_for(lambda: len(results) == 2, 5, "two refused")
        gauges = metrics(gateway)
        assert gauges[("mmgate_admitted_requests", ())] == 2
        assert gauges[("mmgate_queue_depth", ())] == 2
        assert [status for status, _ in results] == [429, 429]
        gateway.proc.send_signal(signal.SIGTERM)
        for thread in threads:
            thread.join(30)
        assert gateway.proc.wait(30) == 0
        finished = [text for status, text in results if status == 200]
        assert len(finished) == 4 and all(text.endswith("data: [DONE]\n\n") for text in finished)
    finally:
        gateway.stop()
