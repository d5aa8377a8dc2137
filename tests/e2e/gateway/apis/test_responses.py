"""POST /v1/responses through `mmgate serve` equals vLLM's own server, seen with the openai
SDK (`responses.create`, `responses.stream`, `responses.retrieve`).

Both run the tiny Qwen3 tool model with the qwen3 reasoning and hermes tool parsers (the
session `api_stack`); outputs are forced per request (`structured_outputs` choice) or driven
by the request's own grammar (tool_choice, text.format). What a client sees must be equal:
the whole Response as JSON with ids, timestamps and prompt-cache counts masked. Streams are
compared event by event once consecutive deltas of one item are joined (how many tokens a
delta carries depends on timing, in vLLM too), with sequence numbers 0..n-1 on each side.

The one deliberate difference: a continuation (`previous_response_id`) replays the previous
turn's reasoning and function calls, where vLLM keeps only its message text.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import httpx
import openai
import pytest

from tests.support.family_e2e import REFERENCE_NAME, data_uri
from tests.support.responses_cases import (
    PARIS,
    STRICT_WEATHER,
    TIME,
    TOKYO,
    WEATHER,
    call_bias,
    forced,
    grammar_driven,
)

THINKING_OFF = {"chat_template_kwargs": {"enable_thinking": False}}
NAMED = {"type": "function", "name": "get_weather"}
CITY_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]}},
    "required": ["city"],
    "additionalProperties": False,
}
ASK = "What is the weather in Paris?"
# The turn a function_call_output answers, passed explicitly as items.
CALLED = [
    {"role": "user", "content": ASK},
    {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Paris."}]},
    {
        "type": "function_call",
        "call_id": "call_1",
        "name": "get_weather",
        "arguments": '{"city": "Paris"}',
    },
    {"type": "function_call_output", "call_id": "call_1", "output": '{"temp_c": 21}'},
]

# name -> request fields beyond model and temperature (extra_body: vLLM's extra fields).
CASES: dict[str, dict[str, Any]] = {
    "text": {
        "input": ASK,
        "instructions": "Answer briefly.",
        "extra_body": forced("It is sunny.", **THINKING_OFF),
    },
    "reasoning_and_text": {"input": ASK, "extra_body": forced("<think>Easy.</think>\n\nSunny ☀")},
    "single_call": {
        "input": ASK,
        "tools": [WEATHER, TIME],
        "extra_body": forced(f"<think>\nThe user wants Paris.\n</think>\n\n{PARIS}"),
    },
    "reasoning_hidden": {
        "input": ASK,
        "tools": [WEATHER],
        "extra_body": forced(f"<think>No.</think>\n\n{PARIS}", include_reasoning=False),
    },
    "effort_none": {
        "input": ASK,
        "tools": [WEATHER],
        "reasoning": {"effort": "none"},
        "extra_body": forced(PARIS),
    },
    "parallel_calls": {
        "input": ASK,
        "tools": [WEATHER],
        "extra_body": forced(f"{PARIS}\n{TOKYO}", **THINKING_OFF),
    },
    "single_call_only": {
        "input": ASK,
        "tools": [WEATHER],
        "parallel_tool_calls": False,
        "extra_body": forced(f"{PARIS}\n{TOKYO}", **THINKING_OFF),
    },
    "named": {
        "input": ASK,
        "tools": [STRICT_WEATHER, TIME],
        "tool_choice": NAMED,
        "max_output_tokens": 60,
        "extra_body": grammar_driven(**THINKING_OFF),
    },
    "required": {
        "input": ASK,
        "tools": [STRICT_WEATHER],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "max_output_tokens": 60,
        "extra_body": grammar_driven(**THINKING_OFF),
    },
    "tool_choice_none": {
        "input": ASK,
        "tools": [WEATHER],
        "tool_choice": "none",
        "extra_body": forced(PARIS, **THINKING_OFF),
    },
    "function_call_output": {
        "input": CALLED,
        "tools": [WEATHER],
        "extra_body": forced("It is 21 °C in Paris.", **THINKING_OFF),
    },
    "json_schema": {
        "input": ASK,
        "text": {"format": {"type": "json_schema", "name": "city", "schema": CITY_SCHEMA}},
        "max_output_tokens": 30,
        "extra_body": {"logit_bias": call_bias(), **THINKING_OFF},
    },
    "max_output_tokens": {
        "input": ASK,
        "max_output_tokens": 4,
        "extra_body": forced("one two three four five six", **THINKING_OFF),
    },
    "logprobs": {
        "input": ASK,
        "include": ["message.output_text.logprobs"],
        "top_logprobs": 2,
        "extra_body": forced("<think>Easy.</think>\n\nSunny"),
    },
}
STREAMED = ("reasoning_and_text", "single_call", "parallel_calls", "named", "max_output_tokens")
STREAMED += ("logprobs", "function_call_output", "reasoning_hidden")

_IDS = re.compile(r"\b(resp|rs|msg|fc)_[0-9a-f]{16}\b|chatcmpl-tool-[0-9a-f]{16}")
# Where the two servers differ without a client seeing a difference in what it asked for:
# when each was made, and what each engine's prefix cache happened to hold.
_MASKED = ("created_at", "cached_tokens", "cache_write_tokens", "model")


def masked(value: Any) -> Any:
    """JSON with ids replaced by their kind and the _MASKED fields dropped."""
    if isinstance(value, dict):
        return {k: masked(v) for k, v in value.items() if k not in _MASKED}
    if isinstance(value, list):
        return [masked(v) for v in value]
    if isinstance(value, str):
        return _IDS.sub(lambda m: f"{m.group(1) or 'call'}_ID", value)
    return value


@pytest.fixture(scope="module")
def clients(api_stack):
    """(vLLM's client and model name, mmgate's)."""
    vllm = openai.OpenAI(base_url=f"{api_stack.vllm_url}/v1", api_key="x", max_retries=0)
    ours = openai.OpenAI(base_url=f"{api_stack.mmgate_url}/v1", api_key="x", max_retries=0)
    return (vllm, REFERENCE_NAME), (ours, str(api_stack.model))


def create(side: tuple[Any, str], **fields: Any) -> Any:
    client, model = side
    return client.responses.create(model=model, temperature=0, **fields)


def whole(response: Any) -> dict:
    # (no warnings: the stream helper's final response holds parsed items)
    return masked(response.model_dump(mode="json", warnings=False))


@pytest.mark.parametrize("case", CASES)
def test_whole_response_equals_vllm(clients, case):
    vllm, ours = (whole(create(side, **CASES[case])) for side in clients)
    assert ours == vllm
    assert ours["status"] in ("completed", "incomplete")


def test_cases_show_what_they_name(clients):
    """The forced outputs make the items each case is about (so the equality above compares
    reasoning, calls, statuses and logprobs, not empty replies)."""
    _, ours = clients

    def kinds(case: str) -> list[str]:
        return [item.type for item in create(ours, **CASES[case]).output]

    assert kinds("reasoning_and_text") == ["reasoning", "message"]
    assert kinds("single_call") == ["reasoning", "function_call"]
    assert kinds("reasoning_hidden") == ["function_call"]
    assert kinds("parallel_calls") == ["function_call", "function_call"]
    assert kinds("single_call_only") == ["function_call"]
    assert kinds("named") == ["function_call"]
    assert kinds("required") == ["function_call"]
    cut = create(ours, **CASES["max_output_tokens"])
    assert (cut.status, cut.incomplete_details.reason) == ("incomplete", "max_output_tokens")
    with_logprobs = create(ours, **CASES["logprobs"])
    assert with_logprobs.output[1].content[0].logprobs[0].top_logprobs


def streamed(side: tuple[Any, str], **fields: Any) -> tuple[list[dict], Any]:
    """The stream's events (JSON) and the SDK's final response."""
    client, model = side
    with client.responses.stream(model=model, temperature=0, **fields) as stream:
        events = [event.model_dump(mode="json", warnings=False) for event in stream]
        final = stream.get_final_response()
    return events, final


def joined(events: list[dict]) -> list[dict]:
    """Consecutive delta events of one item as one (their deltas joined), without sequence
    numbers, the SDK's running snapshots, or logprobs: vLLM attaches an engine step's
    logprobs to the text delta of that step, the gateway a worker message's (several tokens
    when they arrive together, the reasoning's last ones or the EOS among them). Whole
    responses compare logprobs exactly."""
    out: list[dict] = []
    for event in events:
        event = _without_logprobs(event)
        event = {k: v for k, v in event.items() if k not in ("sequence_number", "snapshot")}
        last = out[-1] if out else None
        delta = event["type"].endswith(".delta")
        if delta and last and last["type"] == event["type"] and last["item_id"] == event["item_id"]:
            last["delta"] += event["delta"]
            continue
        out.append(event)
    return out


def _without_logprobs(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_logprobs(v) for k, v in value.items() if k != "logprobs"}
    if isinstance(value, list):
        return [_without_logprobs(v) for v in value]
    return value


@pytest.mark.parametrize("case", STREAMED)
def test_stream_equals_vllm(clients, case):
    seen = []
    for side in clients:
        events, final = streamed(side, **CASES[case])
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        assert events[0]["type"] == "response.created"
        assert events[-1]["type"] == "response.completed"
        done = [e["item"]["id"] for e in events if e["type"] == "response.output_item.done"]
        assert [item.id for item in final.output] == done  # the streamed ids, reused
        seen.append((masked(joined(events)), _without_logprobs(whole(final))))
    assert seen[1] == seen[0]
    if "include" in CASES[case]:  # ours streams logprobs with the text
        assert any(e.get("logprobs") for e in events if e["type"] == "response.output_text.delta")


def test_retrieve_equals_vllm(clients):
    for side in clients:
        created = create(side, **CASES["single_call"])
        client, _ = side
        assert client.responses.retrieve(created.id).model_dump() == created.model_dump()


def test_unknown_previous_response_is_404_as_vllm(clients):
    for side in clients:
        with pytest.raises(openai.NotFoundError) as refused:
            create(side, input="Hi", previous_response_id="resp_0123456789abcdef")
        error = refused.value.body
        assert error["param"] == "response_id"
        assert error["message"] == "Response with id 'resp_0123456789abcdef' not found."


def _tokens(url: str, messages: list[dict], tools: list[dict]) -> int:
    """vLLM's own count of a chat prompt (its /tokenize), tools as the chat API takes them,
    thinking off as in the turn counted."""
    chat_tools = [
        {"type": "function", "function": {k: v for k, v in t.items() if k != "type"}} for t in tools
    ]
    body = {"model": REFERENCE_NAME, "messages": messages, "tools": chat_tools, **THINKING_OFF}
    return httpx.post(f"{url}/tokenize", json=body, timeout=60).json()["count"]


def test_continuation_replays_the_call_vllm_drops(clients, api_stack):
    """A function_call_output sent with previous_response_id: vLLM's prompt holds the user
    turn and the tool result but not the call (nor its reasoning); ours replays both, so its
    prompt is the whole conversation, counted by vLLM's own /tokenize."""
    thought = "\nThe user wants Paris.\n"
    first_turn = {
        "input": ASK,
        "tools": [WEATHER],
        "extra_body": forced(f"<think>{thought}</think>\n\n{PARIS}"),
    }
    input_tokens = []
    for side in clients:
        first = create(side, **first_turn)
        call = first.output[-1]
        assert [item.type for item in first.output] == ["reasoning", "function_call"]
        answer = {"type": "function_call_output", "call_id": call.call_id, "output": "21"}
        second = create(
            side,
            previous_response_id=first.id,
            input=[answer],
            tools=[WEATHER],
            extra_body=forced("It is 21 °C.", **THINKING_OFF),
        )
        assert second.output_text == "It is 21 °C."
        input_tokens.append(second.usage.input_tokens)
        tool_call = {
            "id": call.call_id,
            "type": "function",
            "function": {"name": "get_weather", "arguments": call.arguments},
        }
    user = {"role": "user", "content": ASK}
    result = {"role": "tool", "tool_call_id": tool_call["id"], "content": "21"}
    dropped = [user, result]
    replayed = [
        user,
        {"role": "assistant", "reasoning": thought, "tool_calls": [tool_call]},
        result,
    ]
    vllm_tokens, our_tokens = input_tokens
    assert vllm_tokens == _tokens(api_stack.vllm_url, dropped, [WEATHER])
    assert our_tokens == _tokens(api_stack.vllm_url, replayed, [WEATHER])
    assert our_tokens > vllm_tokens


def test_background_response_completes_as_vllm(clients):
    """background=true answers at once with a queued response; polled, it completes with the
    output a foreground request has."""
    seen = []
    for side in clients:
        client, _ = side
        queued = create(side, background=True, **CASES["reasoning_and_text"])
        assert (queued.status, queued.output) == ("queued", [])
        deadline = time.monotonic() + 60
        while (done := client.responses.retrieve(queued.id)).status in ("queued", "in_progress"):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        seen.append(whole(done))
    assert seen[1] == seen[0]
    assert seen[0]["status"] == "completed"


def test_image_input_equals_vllm(vision_stack):
    from tests.support.e2e_cases import make_image

    image = data_uri(make_image(64, 48, seed=7))
    content = [{"type": "input_text", "text": "Describe."}]
    content.append({"type": "input_image", "image_url": image})
    fields = {"input": [{"role": "user", "content": content}], "max_output_tokens": 8}
    sides = (
        (vision_stack.vllm_url, REFERENCE_NAME),
        (vision_stack.mmgate_url, str(vision_stack.model)),
    )
    seen = []
    for url, model in sides:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        seen.append(whole(create((client, model), **fields)))
    assert seen[1] == seen[0]
    assert seen[0]["usage"]["input_tokens"] > 20  # the image's placeholders counted
    assert json.dumps(seen[0]["output"])  # a message item, text or not


def test_background_stream_equals_vllm(clients):
    """background=true with stream=true streams the run's events as a foreground stream
    does; the run is stored completed."""
    seen = []
    for side in clients:
        client, _ = side
        events, final = streamed(side, background=True, **CASES["reasoning_and_text"])
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        assert client.responses.retrieve(final.id).status == "completed"
        seen.append((masked(joined(events)), whole(final)))
    assert seen[1] == seen[0]
