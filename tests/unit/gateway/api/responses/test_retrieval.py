"""GET, DELETE, input_items and cancel on stored responses, through the app's routes (the
store filled directly: creating responses needs a worker, and is tested end to end)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from gateway.api.responses.background import EventLog
from gateway.api.responses.store import StoredResponse
from gateway.server.app import create_app
from gateway.server.config import GatewayConfig

ITEMS = [{"id": f"msg_{n}", "type": "message", "role": "user"} for n in range(5)]


def _state(app):
    while not hasattr(app, "state"):  # under our middleware
        app = app.app
    return app.state


@pytest.fixture
def client():
    # No worker answers: the store's routes do not need one.
    app = create_app(GatewayConfig(model=Path("/no/model"), workers=["grpc://127.0.0.1:9"]))
    with TestClient(app) as client:
        client.state = _state(app)
        yield client


def put(client, response_id: str, status: str = "completed") -> None:
    response = {"id": response_id, "object": "response", "status": status, "output": []}
    stored = StoredResponse(response, ITEMS, [])
    client.portal.call(client.state.response_store.put, response_id, stored)


def test_a_stored_response_comes_back(client):
    put(client, "resp_a")
    reply = client.get("/v1/responses/resp_a")
    assert reply.status_code == 200
    body = {"id": "resp_a", "object": "response", "status": "completed", "output": []}
    assert reply.json() == body


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/responses/resp_x"),
        ("DELETE", "/v1/responses/resp_x"),
        ("GET", "/v1/responses/resp_x/input_items"),
        ("POST", "/v1/responses/resp_x/cancel"),
    ],
)
def test_an_unknown_id_is_vllm_s_404(client, method, path):
    reply = client.request(method, path)
    assert reply.status_code == 404
    assert reply.json() == {
        "error": {
            "message": "Response with id 'resp_x' not found.",
            "type": "invalid_request_error",
            "param": "response_id",
            "code": 404,
        }
    }


def test_delete_forgets_it(client):
    put(client, "resp_a")
    reply = client.delete("/v1/responses/resp_a")
    assert reply.json() == {"id": "resp_a", "object": "response", "deleted": True}
    assert client.get("/v1/responses/resp_a").status_code == 404


def test_input_items_page_as_openai_s_list(client):
    put(client, "resp_a")
    first = client.get("/v1/responses/resp_a/input_items", params={"limit": 2}).json()
    assert [i["id"] for i in first["data"]] == ["msg_4", "msg_3"]
    assert first["object"] == "list" and first["has_more"] is True
    assert (first["first_id"], first["last_id"]) == ("msg_4", "msg_3")
    rest = client.get(
        "/v1/responses/resp_a/input_items", params={"after": "msg_3", "limit": 10}
    ).json()
    assert [i["id"] for i in rest["data"]] == ["msg_2", "msg_1", "msg_0"]
    assert rest["has_more"] is False
    ascending = client.get("/v1/responses/resp_a/input_items", params={"order": "asc"}).json()
    assert [i["id"] for i in ascending["data"]] == [i["id"] for i in ITEMS]


def test_input_items_refuse_bad_paging(client):
    put(client, "resp_a")
    assert client.get("/v1/responses/resp_a/input_items?limit=0").status_code == 400
    assert client.get("/v1/responses/resp_a/input_items?order=up").status_code == 400
    assert client.get("/v1/responses/resp_a/input_items?after=msg_9").status_code == 404


def test_a_finished_response_cannot_be_cancelled(client):
    put(client, "resp_a")
    reply = client.post("/v1/responses/resp_a/cancel")
    assert reply.status_code == 400
    assert reply.json()["error"]["message"] == "Cannot cancel a synchronous response."


def test_cancel_stops_a_background_run_and_marks_it_cancelled(client):
    put(client, "resp_b", status="in_progress")
    stopped = []

    async def start() -> None:
        async def run() -> None:
            try:
                await asyncio.sleep(60)
            finally:
                stopped.append(True)

        client.state.background.start("resp_b", run())

    client.portal.call(start)
    reply = client.post("/v1/responses/resp_b/cancel")
    assert reply.status_code == 200 and reply.json()["status"] == "cancelled"
    assert stopped == [True]
    assert client.get("/v1/responses/resp_b").json()["status"] == "cancelled"
    assert not client.state.background.running("resp_b")


def test_stream_retrieval_of_a_response_without_an_event_log_is_vllm_s_400(client):
    put(client, "resp_a")
    reply = client.get("/v1/responses/resp_a", params={"stream": "true"})
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert (error["message"], error["param"]) == ("Unknown response_id: resp_a", "response_id")


def test_stream_retrieval_replays_a_background_stream_after_a_sequence_number(client):
    put(client, "resp_s", status="in_progress")
    log = EventLog()
    release = asyncio.Event()

    async def start() -> None:
        async def run() -> None:
            for n in range(3):
                log.append(f"event: e\ndata: {n}\n\n")
            await release.wait()
            log.append("event: e\ndata: 3\n\n")

        client.state.background.start("resp_s", run(), events=log)

    client.portal.call(start)
    with client.stream("GET", "/v1/responses/resp_s?stream=true&starting_after=0") as reply:
        lines = reply.iter_lines()
        first = [next(lines) for _ in range(6)]  # two events of three lines
        client.portal.call(release.set)  # the run goes on while a reader follows it
        rest = list(lines)
    datas = [line for line in first + rest if line.startswith("data:")]
    assert datas == ["data: 1", "data: 2", "data: 3"]
    whole = client.get("/v1/responses/resp_s?stream=true").text
    assert whole.count("event: e") == 4  # finished: the whole log, then the end
