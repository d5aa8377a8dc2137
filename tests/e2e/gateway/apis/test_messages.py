"""The Anthropic Messages API through `mmgate serve` equals vLLM's own server, as the anthropic
SDK sees it: `messages.create`, `messages.stream` and `messages.count_tokens` on the session's
tiny Qwen3 tool model (qwen3 reasoning and hermes tool parsers on both).

A Messages request carries no structured outputs or logit bias, so the outputs are driven by
what it does carry: greedy decoding (random output is thinking: the qwen3 parser reads text
with no `</think>` as reasoning), stop sequences, max_tokens, output_config's JSON schema (an
enum forces a text), and tool_choice (a forced tool that is not strict closes its call at
once on this model; a strict one's grammar lets it write whitespace forever). Each case says
which stop reason vLLM gives, so a case that stops covering what it is for fails.

Where mmgate differs on purpose: `x-api-key` is taken as the API key (vLLM reads only a bearer
token), and a streamed error is typed as its status says (vLLM: "internal_error"). A thinking
budget: tests/e2e/gateway/apis/test_thinking_budget.py.
"""

from __future__ import annotations

import base64
import re
from typing import Any

import anthropic
import httpx
import pytest

from tests.support.gateway_process import GatewayProcess

SDK_FIELDS = {
    "max_tokens", "messages", "metadata", "output_config", "stop_sequences", "system",
    "thinking", "tool_choice", "tools",
}  # fmt: skip
HI = [{"role": "user", "content": "hi"}]
# A forced call of this tool closes at once (`{}`) under greedy decoding on the tiny model.
WEATHER = {
    "name": "get_weather",
    "description": "w",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]}},
        "required": ["city"],
    },
}
NAMED = {"type": "tool", "name": "get_weather"}
ANY = {"type": "any"}
OFF = {"type": "disabled"}  # thinking off: the prompt closes the thought, output is content
HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "Ask the tool.", "signature": "abc"},
            {
                "type": "tool_use",
                "id": "toolu_1",
                "name": "get_weather",
                "input": {"city": "Paris"},
            },
        ],
    },
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "21 C"},
            {"type": "text", "text": "And Tokyo?"},
        ],
    },
]
SYSTEM = [
    {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1; cch=7f3e;"},
    {"type": "text", "text": "You are terse."},
]
JSON_TEXT = {
    "format": {"type": "json_schema", "schema": {"type": "string", "enum": ["Hm</think>Sunny"]}}
}

# name -> (request fields, vLLM's stop reason: whole, streamed). vLLM's streamed qwen3 parser
# goes by token ids and reads a `</think>` or a call spelled in pieces as reasoning; whole, it
# reads the text: hence the thinking-on cases that differ.
CASES: dict[str, tuple[dict[str, Any], tuple[str, str]]] = {
    "max_tokens": ({"messages": HI, "max_tokens": 5}, ("max_tokens", "max_tokens")),
    "stop_sequence": (
        {"messages": HI, "max_tokens": 10, "stop_sequences": ["never", "default"]},
        ("stop_sequence", "stop_sequence"),
    ),
    "end_turn_json_text": (
        {"messages": HI, "max_tokens": 30, "output_config": JSON_TEXT}, ("end_turn", "end_turn")
    ),
    "thinking_off_text": (
        {"messages": HI, "max_tokens": 5, "thinking": OFF}, ("max_tokens", "max_tokens")
    ),
    "system_blocks_sampling": (
        {
            "messages": HI, "system": SYSTEM, "max_tokens": 6, "metadata": {"user_id": "u1"},
            "temperature": 0.9, "top_k": 1, "top_p": 0.5,
        },
        ("max_tokens", "max_tokens"),
    ),
    "tool_named": (
        {"messages": HI, "max_tokens": 60, "tools": [WEATHER], "tool_choice": NAMED},
        ("tool_use", "end_turn"),
    ),
    "tool_named_thinking_off": (
        {
            "messages": HI, "max_tokens": 60, "tools": [WEATHER], "thinking": OFF,
            "tool_choice": NAMED,
        },
        ("tool_use", "tool_use"),
    ),
    "tool_any_single": (
        {
            "messages": HI, "max_tokens": 60, "tools": [WEATHER], "thinking": OFF,
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        },
        ("tool_use", "tool_use"),
    ),
    "tool_any_parallel_cut": (
        {"messages": HI, "max_tokens": 60, "tools": [WEATHER], "thinking": OFF, "tool_choice": ANY},
        ("max_tokens", "max_tokens"),
    ),
    "tool_choice_none": (
        {"messages": HI, "max_tokens": 5, "tools": [WEATHER], "tool_choice": {"type": "none"}},
        ("max_tokens", "max_tokens"),
    ),
    "tool_result_turn": (
        {"messages": HISTORY, "max_tokens": 5, "tools": [WEATHER]}, ("max_tokens", "max_tokens")
    ),
}  # fmt: skip
DELTA_EVENTS = {"content_block_delta"}
RAW_EVENTS = {
    "message_start", "content_block_start", "content_block_delta", "content_block_stop",
    "message_delta", "message_stop",
}  # fmt: skip
ID = re.compile(r"chatcmpl-[0-9a-f]+")
TOOL_ID = re.compile(r"chatcmpl-tool-[0-9a-f]+")
SIGNATURE = re.compile(r"[0-9a-f]{32}")


@pytest.fixture(scope="module")
def peers(api_stack):
    """(client, model name) for vLLM's server and for mmgate."""
    return [
        (_client(api_stack.vllm_url), "tiny"),
        (_client(api_stack.mmgate_url), str(api_stack.model)),
    ]


def _client(url: str, key: str = "x") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key=key, max_retries=0, timeout=120)


def _call(fields: dict[str, Any], model: str) -> dict[str, Any]:
    """SDK keyword arguments: what this SDK version types, the rest as extra_body."""
    fields = {"temperature": 0, **fields}
    known = {k: v for k, v in fields.items() if k in SDK_FIELDS}
    extra = {k: v for k, v in fields.items() if k not in SDK_FIELDS}
    return {"model": model, **known, "extra_body": extra}


def _view(message: Any) -> dict[str, Any]:
    """What a client reads off a Message; ids and signatures checked for form."""
    assert ID.fullmatch(message.id)
    blocks = []
    for block in message.content:
        if block.type == "tool_use":
            assert TOOL_ID.fullmatch(block.id)
            blocks.append(("tool_use", block.name, block.input))
        elif block.type == "thinking":
            assert SIGNATURE.fullmatch(block.signature)
            blocks.append(("thinking", block.thinking))
        else:
            blocks.append((block.type, block.text))
    usage = (message.usage.input_tokens, message.usage.output_tokens)
    return {
        "content": blocks,
        "stop_reason": message.stop_reason,
        "stop_sequence": message.stop_sequence,
        "usage": usage,
        "role": message.role,
        "type": message.type,
    }


def _kinds(events: list[Any]) -> list[tuple[str, str | None]]:
    """The event sequence, each run of deltas of one kind as one (servers cut text into deltas
    where their engines' outputs fall)."""
    out: list[tuple[str, str | None]] = []
    for event in events:
        if event.type not in RAW_EVENTS:
            continue  # the SDK's own derived events
        detail = None
        if event.type == "content_block_delta":
            detail = event.delta.type
        elif event.type == "content_block_start":
            detail = event.content_block.type
        if out and out[-1] == (event.type, detail) and event.type in DELTA_EVENTS:
            continue
        out.append((event.type, detail))
    return out


@pytest.mark.parametrize("case", CASES)
def test_create_equals_vllm_and_count_tokens_its_input(peers, case):
    fields, (whole, _) = CASES[case]
    views, counts = [], []
    for client, model in peers:
        views.append(_view(client.messages.create(**_call(fields, model))))
        prompt = {
            k: v
            for k, v in fields.items()
            if k in ("messages", "system", "tools", "tool_choice", "thinking")
        }
        counts.append(client.messages.count_tokens(model=model, **prompt).input_tokens)
    theirs, ours = views
    assert theirs["stop_reason"] == whole
    assert ours == theirs
    # count_tokens renders as create does (every tool, whatever the choice)
    assert counts == [theirs["usage"][0]] * 2


@pytest.mark.parametrize("case", CASES)
def test_stream_equals_vllm(peers, case):
    fields, (_, streamed) = CASES[case]
    seen = []
    for client, model in peers:
        with client.messages.stream(**_call(fields, model)) as stream:
            events = list(stream)
            message = stream.get_final_message()
        start = events[0]
        assert start.type == "message_start"
        assert start.message.usage.input_tokens == message.usage.input_tokens
        seen.append((_kinds(events), _view(message)))
    (their_kinds, theirs), (our_kinds, ours) = seen
    assert theirs["stop_reason"] == streamed
    assert our_kinds == their_kinds
    assert ours == theirs


def _post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(f"{url}/v1/messages", json=body, headers=headers, timeout=120)


def test_errors_have_vllm_s_shapes(api_stack):
    urls = {"tiny": api_stack.vllm_url, str(api_stack.model): api_stack.mmgate_url}
    for model, url in urls.items():
        # body validation answers as chat's does, OpenAI's shape (as vLLM's request validation)
        missing = _post(url, {"model": model, "messages": HI})
        assert missing.status_code == 400
        assert missing.json()["error"]["param"].endswith("max_tokens")
        for stream in (False, True):
            unknown = _post(
                url, {"model": "nope", "messages": HI, "max_tokens": 4, "stream": stream}
            )
            assert unknown.status_code == 404
            body = unknown.json()
            assert body["type"] == "error"
            assert body["error"]["type"] == "NotFoundError"
            assert body["error"]["message"].startswith("The model `nope` does not exist.")


def test_a_forced_call_whose_arguments_are_no_object_is_a_400_as_in_vllm(peers):
    """A tool that is not strict, forced: the tiny model writes the arguments `4e+30`."""
    tool = {**WEATHER, "input_schema": {**WEATHER["input_schema"], "additionalProperties": False}}
    del tool["description"]
    fields = {"messages": HI, "max_tokens": 300, "tools": [tool], "tool_choice": {"type": "any"}}
    for client, model in peers:
        with pytest.raises(anthropic.BadRequestError) as refused:
            client.messages.create(**_call(fields, model))
        assert "4e+30" in str(refused.value)


def test_the_api_key_is_taken_from_x_api_key(api_stack, tmp_path):
    """The anthropic SDK sends its key as `x-api-key`, with no Authorization header."""
    key = "sk-test-7"
    gateway = GatewayProcess(
        api_stack.model, [api_stack.worker.address], tmp_path / "gw.log", "--api-key", key
    )
    try:
        gateway.wait_ready()
        model = str(api_stack.model)
        reply = _client(gateway.base_url, key).messages.create(
            model=model, messages=HI, max_tokens=2
        )
        assert reply.usage.output_tokens == 2
        with pytest.raises(anthropic.AuthenticationError):
            _client(gateway.base_url, "wrong").messages.create(
                model=model, messages=HI, max_tokens=2
            )
        bearer = {"Authorization": f"Bearer {key}"}
        assert (
            _post(
                gateway.base_url, {"model": model, "messages": HI, "max_tokens": 2}, bearer
            ).status_code
            == 200
        )
    finally:
        gateway.stop()


def _image_message(source: dict[str, Any]) -> list[dict[str, Any]]:
    block = {"type": "image", "source": source}
    return [{"role": "user", "content": [block, {"type": "text", "text": "What is this?"}]}]


def test_images_base64_and_url_equal_vllm(vision_stack, tmp_path):
    from tests.support.e2e_cases import IMAGE, png_bytes
    from tests.support.http_files import serve_bytes

    png = png_bytes(IMAGE)
    data = {"type": "base64", "media_type": "image/png", "data": base64.b64encode(png).decode()}
    # loopback image hosts are refused by default (SSRF): this gateway allows them
    flags = ("--allow-private-media-networks", "127.0.0.0/8")
    gateway = GatewayProcess(
        vision_stack.model, [vision_stack.worker.address], tmp_path / "gw.log", *flags
    )
    try:
        gateway.wait_ready()
        peers = [
            (_client(vision_stack.vllm_url), "tiny"),
            (_client(gateway.base_url), str(vision_stack.model)),
        ]
        with serve_bytes(png) as host:
            for source in (data, {"type": "url", "url": f"{host}/cat.png"}):
                messages = _image_message(source)
                fields = {"messages": messages, "max_tokens": 8}
                views, streamed, counts = [], [], []
                for client, model in peers:
                    views.append(_view(client.messages.create(**_call(fields, model))))
                    with client.messages.stream(**_call(fields, model)) as stream:
                        streamed.append(_view(stream.get_final_message()))
                    counts.append(
                        client.messages.count_tokens(model=model, messages=messages).input_tokens
                    )
                assert views[1] == views[0]
                assert streamed[1] == streamed[0]
                assert counts == [views[0]["usage"][0]] * 2
    finally:
        gateway.stop()
