"""Chat output becomes what vLLM's converters make of it: the same stream events
(`message_stream_converter`) from the same chunks, and the same Message
(`messages_full_converter`) from the same chat completion. Thinking signatures are random
in both and compared by shape."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest

from gateway.api.messages.events import message_events
from gateway.api.messages.reply import to_message
from gateway.errors import GatewayError

PROMPT = 17
HEAD = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}


def _choice(delta: dict, finish: str | None = None, stop: Any = None) -> list[dict]:
    entry: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    if finish is not None:
        entry["stop_reason"] = stop
    return [entry]


def _call(index: int, id_: str | None = None, name: str | None = None, args: str | None = None):
    call: dict[str, Any] = {"index": index}
    if id_ is not None:
        call.update(id=id_, type="function")
    function = {k: v for k, v in (("name", name), ("arguments", args)) if v is not None}
    if function:
        call["function"] = function
    return call


def _stream(deltas: list[dict], finish: str, stop: Any = None, generated: int = 5) -> list:
    """Chat chunks as ChatRun.chunks() yields them: role chunk, deltas (the finish reason on
    the last), then the usage chunk."""
    chunks = [(_choice({"role": "assistant", "content": ""}), None)]
    for i, delta in enumerate(deltas):
        last = i == len(deltas) - 1
        chunks.append((_choice(delta, finish if last else None, stop if last else None), None))
    usage = {
        "prompt_tokens": PROMPT,
        "completion_tokens": generated,
        "total_tokens": PROMPT + generated,
    }
    chunks.append(([], usage))
    return chunks


STREAMS = {
    "thinking_then_text": _stream(
        [{"reasoning": "Let me "}, {"reasoning": "see."}, {"content": "Sunny"}, {"content": "."}],
        "stop",
    ),
    "text_then_calls": _stream(
        [
            {"content": "Checking."},
            {"tool_calls": [_call(0, "chatcmpl-tool-a", "get_weather", '{"city": ')]},
            {"tool_calls": [_call(0, args='"Paris"}')]},
            {"tool_calls": [_call(1, "chatcmpl-tool-b", "get_time", "{}")]},
        ],
        "tool_calls",
    ),
    "text_inside_a_call": _stream(
        [
            {"tool_calls": [_call(0, "chatcmpl-tool-a", "get_weather", "{}")]},
            {"content": "held "},
            {"content": "text"},
        ],
        "tool_calls",
    ),
    "named_call_says_stop": _stream(
        [{"tool_calls": [_call(0, "chatcmpl-tool-a", "get_weather", '{"city": "Tokyo"}')]}], "stop"
    ),
    "length": _stream([{"reasoning": "Hmm"}, {"content": "It is"}], "length"),
    "stop_string": _stream([{"content": "It is"}], "stop", "END"),
    "stop_token": _stream([{"content": "It is"}], "stop", 151643),
    "call_cut_by_stop_string": _stream(
        [{"tool_calls": [_call(0, "chatcmpl-tool-a", "get_weather", '{"city": "Par')]}],
        "stop",
        "is",
    ),
    "empty": _stream([{}], "stop", generated=0),
    "reasoning_after_text": _stream(
        [{"reasoning": "a"}, {"content": "b"}, {"reasoning": "c"}, {"content": "d"}], "stop"
    ),
}


@pytest.fixture(scope="module")
def vllm():
    from vllm.entrypoints.anthropic.serving import AnthropicServingMessages
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionResponse

    return AnthropicServingMessages, ChatCompletionResponse


def _events(text: str) -> list[tuple[str, dict]]:
    """(event, data) pairs, the signatures checked for shape and blanked."""
    out = []
    for block in text.strip().split("\n\n"):
        event, data = block.split("\n", 1)
        body = json.loads(data.removeprefix("data: "))
        delta = body.get("delta") or {}
        if delta.get("type") == "signature_delta":
            assert re.fullmatch(r"[0-9a-f]{32}", delta["signature"])
            delta["signature"] = "*"
        out.append((event.removeprefix("event: "), body))
    return out


async def _collect(events) -> str:
    return "".join([event async for event in events])


def _theirs(vllm, chunks: list) -> str:
    async def sse():
        for n, (choices, usage) in enumerate(chunks):
            if n == 0:  # vLLM's first chunk carries the prompt's usage (continuous usage)
                usage = {"prompt_tokens": PROMPT, "completion_tokens": 0, "total_tokens": PROMPT}
            body = {**HEAD, "choices": choices, **({"usage": usage} if usage else {})}
            yield f"data: {json.dumps(body)}\n\n"
        yield "data: [DONE]\n\n"

    return asyncio.run(_collect(vllm[0].message_stream_converter(None, sse())))


def _ours(chunks: list) -> str:
    async def source():
        for chunk in chunks:
            yield chunk

    return asyncio.run(_collect(message_events(source(), "chatcmpl-1", "m", lambda: PROMPT)))


@pytest.mark.parametrize("case", STREAMS)
def test_the_events_are_vllm_s(vllm, case):
    assert _events(_ours(STREAMS[case])) == _events(_theirs(vllm, STREAMS[case]))


def _completion(message: dict, finish: str, stop: Any = None) -> dict:
    message = {"role": "assistant", "content": None, "reasoning": None, "tool_calls": [], **message}
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
    usage = {"prompt_tokens": PROMPT, "completion_tokens": 9, "total_tokens": PROMPT + 9}
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [{**choice, "stop_reason": stop}],
        "usage": usage,
    }


def _tool(id_: str, name: str, arguments: str) -> dict:
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}


COMPLETIONS = {
    "all_blocks": _completion(
        {
            "reasoning": "Think.",
            "content": "Checking.",
            "tool_calls": [_tool("chatcmpl-tool-a", "get_weather", '{"city": "Paris"}')],
        },
        "tool_calls",
    ),
    "named_call_says_stop": _completion(
        {"tool_calls": [_tool("chatcmpl-tool-a", "get_time", "{}")]}, "stop"
    ),
    "text": _completion({"content": "Sunny."}, "stop"),
    "length": _completion({"reasoning": "Hmm"}, "length"),
    "stop_string": _completion({"content": "It is"}, "stop", "END"),
    "empty": _completion({"content": ""}, "stop"),
}


def _signed(message: dict) -> dict:
    for block in message["content"]:
        if block["type"] == "thinking":
            assert re.fullmatch(r"[0-9a-f]{32}", block["signature"])
            block["signature"] = "*"
    return message


@pytest.mark.parametrize("case", COMPLETIONS)
def test_the_message_is_vllm_s(vllm, case):
    serving, response = vllm
    theirs = serving.messages_full_converter(None, response.model_validate(COMPLETIONS[case]))
    assert _signed(to_message(COMPLETIONS[case])) == _signed(theirs.model_dump(exclude_none=True))


def test_arguments_that_are_not_an_object_are_a_400_as_in_vllm():
    completion = _completion(
        {"tool_calls": [_tool("chatcmpl-tool-a", "get_time", "4e+30")]}, "stop"
    )
    with pytest.raises(GatewayError) as refused:
        to_message(completion)
    assert refused.value.status == 400
    assert "4e+30" in refused.value.message


def test_a_stream_that_fails_ends_with_anthropic_s_error_event():
    from gateway.api.messages.events import error_event
    from gateway.stream.sse import _framed

    async def failing():
        yield "event: message_start\ndata: {}\n\n"
        raise GatewayError("engine worker: gone", 503)

    async def read() -> str:
        return "".join([e async for e in _framed(failing(), done=None, error=error_event)])

    last = _events(asyncio.run(read()))[-1]
    error = {"type": "ServiceUnavailableError", "message": "engine worker: gone"}
    assert last == ("error", {"type": "error", "error": error})
