"""Responses input -> chat messages equals vLLM's construct_input_messages (the items of one
assistant turn merged as vLLM merges them), except where the gateway deliberately differs:
`input_image` parts become chat `image_url` parts (for chat's image path), and a stored
response's output replays whole (reasoning and function calls too)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gateway.api.responses import items
from gateway.errors import GatewayError

USER = {"role": "user", "content": "Weather in Paris?"}
REASONING = {
    "type": "reasoning",
    "summary": [],
    "content": [{"type": "reasoning_text", "text": "Paris."}],
}
CALL = {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"}
CALL2 = {**CALL, "call_id": "c2", "arguments": '{"city": "Tokyo"}'}
OUTPUT = {"type": "function_call_output", "call_id": "c1", "output": "21"}
SAID = {
    "type": "message",
    "role": "assistant",
    "content": [{"type": "output_text", "text": "Let me check."}],
}

CASES: dict[str, tuple[str | None, Any]] = {
    "string": ("Be brief.", "Hi"),
    "user_parts": (None, [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}]),
    "one_turn": (None, [USER, REASONING, SAID, CALL, CALL2, OUTPUT]),
    "call_first": ("Sys", [USER, CALL, OUTPUT, {"role": "assistant", "content": "21 °C"}]),
    "two_reasonings": (None, [USER, REASONING, REASONING]),
    "summary_only": (
        None,
        [USER, {"type": "reasoning", "summary": [{"type": "summary_text", "text": "S"}]}, CALL],
    ),
    "developer": (None, [{"role": "developer", "content": "d"}, USER]),
}


@pytest.fixture(scope="module")
def vllm_messages():
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
    from vllm.entrypoints.openai.responses.utils import construct_input_messages

    def build(instructions: str | None, input: Any) -> list[dict]:
        request = ResponsesRequest(input=copy.deepcopy(input), instructions=instructions)
        messages = construct_input_messages(
            request_instructions=request.instructions, request_input=request.input
        )
        # vLLM passes a message item on as it came (its "type" key is not read again).
        return [{k: v for k, v in dict(m).items() if k != "type"} for m in messages]

    return build


@pytest.mark.parametrize("case", CASES)
def test_messages_equal_vllm(vllm_messages, case):
    instructions, input = CASES[case]
    assert items.input_messages(instructions, copy.deepcopy(input)) == vllm_messages(
        instructions, input
    )


def test_an_input_image_becomes_a_chat_image_part():
    part = {"type": "input_image", "image_url": "data:image/png;base64,AA"}
    message = {"role": "user", "content": [{"type": "input_text", "text": "What?"}, part]}
    (converted,) = items.input_messages(None, [message])
    assert converted["content"][1] == {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64,AA"},
        "detail": "auto",  # vLLM's default for a part without one, shown to the template
    }


def test_history_replays_reasoning_and_calls_after_the_instructions():
    earlier = [USER]
    output = [
        {**REASONING, "id": "rs_1", "status": None},
        {**CALL, "id": "fc_1", "status": "completed"},
    ]
    history = [*earlier, *items.to_messages(output)]
    messages = items.input_messages("New rules.", [OUTPUT], history)
    assert messages == [
        {"role": "system", "content": "New rules."},
        USER,
        {
            "role": "assistant",
            "reasoning": "Paris.",
            "tool_calls": [
                {
                    "id": "c1",
                    "function": {"name": "get_weather", "arguments": "{}"},
                    "type": "function",
                }
            ],
        },
        {"role": "tool", "content": "21", "tool_call_id": "c1"},
    ]


def test_earlier_system_messages_do_not_carry_over():
    history = [{"role": "system", "content": "Old."}, USER]
    assert items.input_messages(None, "Next?", history) == [
        USER,
        {"role": "user", "content": "Next?"},
    ]


@pytest.mark.parametrize(
    "item",
    [
        {"type": "item_reference", "id": "x"},
        {**REASONING, "encrypted_content": "opaque"},
        {"role": "user", "content": [{"type": "input_file", "file_id": "f"}]},
        {"role": "user", "content": [{"type": "input_image", "file_id": "f"}]},
        {"type": "function_call", "call_id": "c"},
        {"type": "reasoning", "summary": [{"text": "untyped"}]},
    ],
)
def test_items_the_gateway_cannot_render_are_400s_naming_input(item):
    with pytest.raises(GatewayError) as refused:
        items.input_messages(None, [USER, item])
    assert (refused.value.status, refused.value.param) == (400, "input")


def test_a_final_incomplete_assistant_message_is_continued():
    partial = {**SAID, "status": "incomplete"}
    assert items.continues_final_message([USER, partial])
    assert not items.continues_final_message([USER, SAID])
    assert not items.continues_final_message("Hi")


def test_listed_items_have_ids():
    listed = items.listed_items("Hi")
    assert listed[0]["id"].startswith("msg_")
    assert listed[0]["content"] == [{"type": "input_text", "text": "Hi"}]
    given = [{**CALL, "id": "fc_mine"}, OUTPUT]
    assert [i["id"][:4] for i in items.listed_items(given)] == ["fc_m", "fco_"]
