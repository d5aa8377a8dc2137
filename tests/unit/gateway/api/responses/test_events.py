"""Chat deltas -> Responses events equal vLLM's SimpleStreamingEventProcessor fed the same
deltas (as its serving loop feeds it: split, transition, open, emit; closed at the end), ids
masked; sequence numbers count 0..n-1 and the items closed are the final output."""

from __future__ import annotations

import re
from typing import Any

import pytest

from gateway.api.responses.events import StreamEvents, split_delta


def call(index: int, name: str | None = None, arguments: str | None = None) -> dict:
    function = {k: v for k, v in (("name", name), ("arguments", arguments)) if v is not None}
    out: dict[str, Any] = {"index": index, "function": function}
    if name is not None:
        out.update(id=f"chatcmpl-tool-{index}", type="function")
    return out


# Each: the chat deltas of one stream (the dicts ChatRun.chunks() carries).
STREAMS: dict[str, list[dict]] = {
    "text": [{"role": "assistant", "content": ""}, {"content": "Hel"}, {"content": "lo"}],
    "reasoning_text": [{"reasoning": "Hm"}, {"reasoning": "m."}, {"content": "\n\nYes"}],
    "merged_delta": [{"reasoning": "Hm", "content": "Yes"}, {"content": "!"}],
    "calls": [
        {"reasoning": "Two."},
        {"content": "\n\n"},
        {"tool_calls": [call(0, "f")]},
        {"tool_calls": [call(0, arguments='{"a"')]},
        {"tool_calls": [call(0, arguments=": 1}")]},
        {"tool_calls": [call(1, "g", "{}")]},
    ],
    "two_calls_in_one_delta": [{"tool_calls": [call(0, "f", "{}"), call(1, "g", "[]")]}],
    "empty_content_ignored": [{"content": ""}, {"reasoning": "r"}, {"content": ""}],
}
_IDS = re.compile(r"\b(rs|msg|fc)_[0-9a-f]{16}\b")


def masked(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: masked(v) for k, v in value.items()}
    if isinstance(value, list):
        return [masked(v) for v in value]
    if isinstance(value, str):
        return _IDS.sub(lambda m: f"{m.group(1)}_ID", value)
    return value


@pytest.fixture(scope="module")
def vllm_events():
    from vllm.entrypoints.generate.base.protocol import (
        DeltaFunctionCall,
        DeltaMessage,
        DeltaToolCall,
    )
    from vllm.entrypoints.openai.responses import streaming_events as se

    def to_message(delta: dict) -> Any:
        calls = [
            DeltaToolCall(
                index=c["index"],
                id=c.get("id"),
                type=c.get("type"),
                function=DeltaFunctionCall(**c["function"]) if "function" in c else None,
            )
            for c in delta.get("tool_calls") or []
        ]
        return DeltaMessage(
            content=delta.get("content"), reasoning=delta.get("reasoning"), tool_calls=calls
        )

    def run(deltas: list[dict]) -> tuple[list[dict], list[dict]]:
        processor = se.SimpleStreamingEventProcessor()
        events = []
        for delta in deltas:
            for dm in se.split_delta(to_message(delta)):
                target, tool_call = processor.resolve_target_state(dm)
                if target == se._StateType.NONE:
                    continue
                if processor.needs_transition(target, tool_call):
                    events += processor.close_current()
                    events += processor.open(target, tool_call)
                events += processor.emit_delta(dm, None)
        events += processor.close_current()
        dumped = [e.model_dump(mode="json", by_alias=True) for e in events]
        items = [i.model_dump(mode="json", by_alias=True) for i in processor.output_items]
        return dumped, items

    return run


@pytest.mark.parametrize("case", STREAMS)
def test_events_equal_vllm(vllm_events, case):
    events = StreamEvents()
    ours = [e for delta in STREAMS[case] for e in events.delta(delta)] + events.close()
    assert [e.pop("sequence_number") for e in ours] == list(range(len(ours)))
    theirs, theirs_items = vllm_events(STREAMS[case])
    for event in theirs:
        event.pop("sequence_number")
    assert masked(ours) == masked(theirs)
    assert masked(events.output) == masked(theirs_items)


def test_text_deltas_carry_their_logprobs_and_the_part_keeps_them():
    entry = {"token": "a", "logprob": -1.0, "bytes": [97], "top_logprobs": []}
    events = StreamEvents()
    delta = events.delta({"content": "a"}, [entry])[-1]
    assert delta["logprobs"] == [{"token": "a", "logprob": -1.0, "top_logprobs": []}]
    done = events.close()
    assert done[1]["part"]["logprobs"] == [entry]  # content_part.done, with bytes
    assert events.output[0]["content"][0]["logprobs"] == [entry]


def test_the_stream_starts_and_ends_with_the_response():
    events = StreamEvents()
    response = {"id": "resp_1", "status": "in_progress", "output": []}
    started = events.started(response)
    assert [e["type"] for e in started] == ["response.created", "response.in_progress"]
    added = events.delta({"content": "x"})[0]
    events.close()
    final = events.completed({"id": "resp_1", "status": "incomplete", "output": events.output})
    assert final[-1]["type"] == "response.completed"  # the last event, incomplete or not
    assert final[-1]["sequence_number"] == events.sequence - 1
    assert final[-1]["response"]["output"][0]["id"] == added["item"]["id"]


def test_split_delta_orders_reasoning_content_calls():
    parts = split_delta({"content": "c", "reasoning": "r", "tool_calls": [call(0, "f")]})
    assert [next(iter(p)) for p in parts] == ["reasoning", "content", "tool_calls"]
