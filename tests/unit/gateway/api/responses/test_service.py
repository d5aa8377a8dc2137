"""ResponsesService on a stand-in chat path: the chat request a Responses request becomes,
what is stored and replayed, and background runs (completed, cancelled) in the store."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest

from gateway.api.responses.background import BackgroundRuns
from gateway.api.responses.protocol import ResponsesRequest
from gateway.api.responses.service import ResponsesService, to_chat_request
from gateway.api.responses.store import StoredResponse
from gateway.errors import GatewayError

TOOL = {"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": True}


def chat(body: dict[str, Any]) -> Any:
    request = ResponsesRequest.model_validate(body)
    return to_chat_request(request, [{"role": "user", "content": "Hi"}])


def test_the_chat_request_tokenizes_with_special_tokens_as_vllm_responses_does():
    converted = chat({"input": "Hi"})
    assert converted.add_special_tokens is True
    assert (converted.add_generation_prompt, converted.continue_final_message) == (True, False)
    assert converted.tool_choice == "none" and converted.tools is None


def test_tools_and_a_named_choice_become_chat_ones():
    converted = chat(
        {"input": "Hi", "tools": [TOOL], "tool_choice": {"type": "function", "name": "f"}}
    )
    assert converted.tools == [
        {
            "type": "function",
            "function": {
                "name": "f",
                "description": None,
                "parameters": {"type": "object"},
                "strict": True,
            },
        }
    ]
    assert converted.tool_choice == {"type": "function", "function": {"name": "f"}}


def test_sampling_format_reasoning_and_logprobs_carry_over():
    converted = chat(
        {
            "input": "Hi",
            "max_output_tokens": 9,
            "temperature": 0.3,
            "top_k": 5,
            "reasoning": {"effort": "low"},
            "include_reasoning": False,
            "parallel_tool_calls": False,
            "include": ["message.output_text.logprobs"],
            "top_logprobs": 2,
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
            "truncation": "auto",
            "stream": True,
        }
    )
    assert (converted.max_tokens, converted.temperature, converted.top_k) == (9, 0.3, 5)
    assert converted.reasoning_effort == "low" and converted.include_reasoning is False
    assert (converted.logprobs, converted.top_logprobs) == (True, 2)
    assert converted.output_constraint() == {"json": {"type": "object"}}
    assert converted.truncate_prompt_tokens == -1
    assert converted.stream and converted.stream_options.include_usage


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "Hi", "background": True, "store": False}, "background"),
        ({"input": "Hi", "tool_choice": "required"}, "tool_choice"),
        (
            {"input": "Hi", "tools": [TOOL], "tool_choice": {"type": "function", "name": "g"}},
            "tool_choice",
        ),
        ({"input": "Hi", "tools": [{"type": "web_search"}]}, "tools"),
        ({"input": "Hi", "prompt": {"id": "p"}}, "prompt"),
        ({"input": "Hi", "previous_input_messages": [{}]}, "previous_input_messages"),
    ],
)
def test_refusals_name_the_field(body, param):
    from gateway.errors import parse_body

    with pytest.raises(GatewayError) as refused:
        parse_body(ResponsesRequest, body)
    assert (refused.value.status, refused.value.param) == (400, param)


def test_text_format_and_structured_outputs_together_are_refused_as_vllm():
    body = {"input": "Hi", "text": {"format": {"type": "json_object"}}}
    with pytest.raises(GatewayError) as refused:
        chat({**body, "structured_outputs": {"choice": ["a"]}})
    assert refused.value.param == "structured_outputs"


class DictStore:
    def __init__(self) -> None:
        self.kept: dict[str, StoredResponse] = {}

    async def put(self, response_id: str, stored: StoredResponse) -> None:
        self.kept[response_id] = stored

    async def get(self, response_id: str) -> StoredResponse | None:
        return self.kept.get(response_id)

    async def delete(self, response_id: str) -> bool:
        return self.kept.pop(response_id, None) is not None


class FakeRun:
    """A ChatRun's surface, answering `message` (after `delay` seconds)."""

    def __init__(self, message: dict, delay: float = 0.0) -> None:
        self.message, self.delay = message, delay
        self.parsing = object()
        self.worker = SimpleNamespace(facts=SimpleNamespace(sampling_defaults={}))
        params = SimpleNamespace(max_tokens=50, HasField=lambda name: True)
        self.generation = SimpleNamespace(generate=SimpleNamespace(sampling_params=params))
        self.choices = [SimpleNamespace(finish_reason="stop")]

    async def chunks(self) -> Any:
        await asyncio.sleep(self.delay)
        entry = {"index": 0, "delta": {"content": self.message["content"]}, "logprobs": None}
        yield [entry], None
        yield [], {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}

    async def complete(self) -> dict:
        await asyncio.sleep(self.delay)
        usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
        choice = {"message": self.message, "logprobs": None}
        return {"choices": [choice], "usage": usage}


class FakeChat:
    model_name = "m"

    def __init__(self, message: dict, delay: float = 0.0) -> None:
        self.message, self.delay = message, delay
        self.requests: list[Any] = []

    async def start(self, request: Any) -> FakeRun:
        self.requests.append(request)
        return FakeRun(self.message, self.delay)


CALLED = {
    "content": None,
    "reasoning": "Think.",
    "tool_calls": [
        {"id": "call_9", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    ],
}


def body_of(response: Any) -> dict:
    return json.loads(response.body)


def test_a_continuation_replays_the_stored_turn_and_its_output():
    async def go() -> None:
        store = DictStore()
        fake = FakeChat(CALLED)
        service = ResponsesService(fake, store, BackgroundRuns())
        first = body_of(
            await service.create({"input": "Hi", "instructions": "Sys", "tools": [TOOL]})
        )
        stored = store.kept[first["id"]]
        assert stored.messages == [{"role": "user", "content": "Hi"}]  # no system message
        assert [i["type"] for i in stored.response["output"]] == ["reasoning", "function_call"]
        answer = {"type": "function_call_output", "call_id": "call_9", "output": "ok"}
        await service.create(
            {"input": [answer], "previous_response_id": first["id"], "tools": [TOOL]}
        )
        assert fake.requests[-1].messages == [
            {"role": "user", "content": "Hi"},
            {
                "role": "assistant",
                "reasoning": "Think.",
                "tool_calls": [
                    {
                        "id": "call_9",
                        "function": {"name": "f", "arguments": "{}"},
                        "type": "function",
                    }
                ],
            },
            {"role": "tool", "content": "ok", "tool_call_id": "call_9"},
        ]

    asyncio.run(go())


def test_an_unknown_previous_response_is_a_404_naming_response_id():
    async def go() -> None:
        service = ResponsesService(FakeChat(CALLED), DictStore(), BackgroundRuns())
        with pytest.raises(GatewayError) as refused:
            await service.create({"input": "Hi", "previous_response_id": "resp_x"})
        assert (refused.value.status, refused.value.param) == (404, "response_id")

    asyncio.run(go())


def test_store_false_keeps_nothing():
    async def go() -> None:
        store = DictStore()
        service = ResponsesService(FakeChat({"content": "a", "reasoning": None}), store)
        await service.create({"input": "Hi", "store": False})
        assert store.kept == {}

    asyncio.run(go())


def test_background_runs_are_queued_then_completed_or_cancelled():
    async def go() -> None:
        store, runs = DictStore(), BackgroundRuns()
        quick = ResponsesService(FakeChat({"content": "a", "reasoning": None}), store, runs)
        queued = body_of(await quick.create({"input": "Hi", "background": True}))
        assert (queued["status"], queued["output"]) == ("queued", [])
        while runs.running(queued["id"]):
            await asyncio.sleep(0.01)
        assert store.kept[queued["id"]].response["status"] == "completed"

        slow = ResponsesService(FakeChat({"content": "a", "reasoning": None}, 30), store, runs)
        queued = body_of(await slow.create({"input": "Hi", "background": True}))
        await asyncio.sleep(0.05)
        assert store.kept[queued["id"]].response["status"] == "in_progress"
        assert await runs.cancel(queued["id"])
        assert store.kept[queued["id"]].response["status"] == "cancelled"

    asyncio.run(go())


def test_a_streamed_background_run_goes_on_when_the_client_leaves():
    async def go() -> None:
        store, runs = DictStore(), BackgroundRuns()
        slow = FakeChat({"content": "a", "reasoning": None}, delay=0.2)
        service = ResponsesService(slow, store, runs)
        streamed = await service.create({"input": "Hi", "background": True, "stream": True})
        stream = streamed.body_iterator
        first = await anext(stream)
        assert "event: response.created" in first
        await stream.aclose()  # the client leaves
        (response_id,) = store.kept
        assert runs.running(response_id)
        while runs.running(response_id):
            await asyncio.sleep(0.01)
        stored = store.kept[response_id].response
        assert stored["status"] == "completed"
        assert stored["output"][0]["content"][0]["text"] == "a"

    asyncio.run(go())


def test_a_cancel_or_delete_taken_by_another_process_stops_the_run_and_sticks(monkeypatch):
    """Two gateway processes on one shared store (--api-server-count): the run lives in the
    process that started it; the other can only change the store. The run reads it back,
    stops, and never writes over a cancelled or deleted response."""
    from gateway.api.responses import background
    from gateway.api.responses.retrieval import ResponseRef, StoredResponses

    monkeypatch.setattr(background, "WATCH_SECONDS", 0.02)

    async def go() -> None:
        store = DictStore()
        here = BackgroundRuns(shared_store=store)
        slow = ResponsesService(FakeChat({"content": "a", "reasoning": None}, 30), store, here)
        there = StoredResponses(store, BackgroundRuns(shared_store=store))
        for ended_by in ("cancel", "delete"):
            queued = body_of(await slow.create({"input": "Hi", "background": True}))
            response_id = queued["id"]
            await asyncio.sleep(0.05)
            assert here.running(response_id)
            if ended_by == "cancel":
                answer = await there.cancel(ResponseRef(response_id=response_id))
                assert answer["status"] == "cancelled"
            else:
                await there.delete(ResponseRef(response_id=response_id))
            for _ in range(100):
                if not here.running(response_id):
                    break
                await asyncio.sleep(0.01)
            assert not here.running(response_id), ended_by
            if ended_by == "cancel":
                assert store.kept[response_id].response["status"] == "cancelled"
            else:
                assert response_id not in store.kept  # not brought back by the run

    asyncio.run(go())


def test_a_run_finishing_after_another_process_cancelled_it_stays_cancelled():
    async def go() -> None:
        store = DictStore()
        runs = BackgroundRuns(shared_store=store)  # (watching every 0.5 s: too late here)
        quick = ResponsesService(FakeChat({"content": "a", "reasoning": None}, 0.1), store, runs)
        queued = body_of(await quick.create({"input": "Hi", "background": True}))
        await asyncio.sleep(0.02)
        store.kept[queued["id"]].response["status"] = "cancelled"  # another process's cancel
        while runs.running(queued["id"]):
            await asyncio.sleep(0.01)
        assert store.kept[queued["id"]].response["status"] == "cancelled"

    asyncio.run(go())
