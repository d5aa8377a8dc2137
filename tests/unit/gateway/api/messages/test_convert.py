"""A Messages request becomes the chat request vLLM's `to_chat_completion_request` makes of it:
the same messages, tools, tool_choice and sampling fields, request by request."""

from __future__ import annotations

import pytest

from gateway.api.messages.convert import image_url, to_chat_request
from gateway.api.messages.protocol import CountTokensRequest, MessagesRequest

WEATHER = {
    "name": "get_weather",
    "description": "Current weather",
    "input_schema": {"properties": {"city": {"type": "string"}}, "required": ["city"]},
}
TIME = {"name": "get_time", "input_schema": {"type": "object"}, "strict": True}
PNG = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}
HISTORY = [
    {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "Use the tool.", "signature": "abc"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "text", "text": "Checking."},
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
            {
                "type": "tool_result",
                "tool_use_id": "toolu_2",
                "content": [
                    {"type": "text", "text": "a map"},
                    {"type": "image", "source": PNG},
                    {"type": "tool_reference", "tool_name": "get_time"},
                ],
            },
            {"type": "text", "text": "And now?"},
        ],
    },
]
HI = [{"role": "user", "content": "hi"}]

# name -> a Messages request body (model and max_tokens added)
CASES = {
    "plain": {"messages": HI},
    "system_string": {"system": "Be brief.", "messages": HI},
    "system_blocks": {
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=ab12;"},
            {"type": "text", "text": "Be brief. "},
            {"type": "text", "text": "Be kind."},
        ],
        "messages": HI,
    },
    "inline_system": {
        "messages": [
            *HI,
            {"role": "system", "content": "Reminder."},
            {"role": "user", "content": "ok"},
        ]
    },
    "images": {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image", "source": PNG},
                    {"type": "image", "source": {"type": "url", "url": "https://x.test/a.png"}},
                    {"type": "text", "text": "Compare."},
                ],
            }
        ]
    },
    "history": {"messages": HISTORY, "tools": [WEATHER, TIME]},
    "assistant_tool_result": {
        "messages": [
            *HI,
            {
                "role": "assistant",
                "content": [{"type": "tool_result", "tool_use_id": "t", "content": "5"}],
            },
        ]
    },
    "only_tool_results": {
        "messages": [
            *HI,
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t", "name": "get_time", "input": {}}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t", "content": "noon"}],
            },
        ],
        "tools": [TIME],
    },
    "tools_auto_default": {"messages": HI, "tools": [WEATHER, TIME]},
    "tool_choice_auto": {"messages": HI, "tools": [WEATHER], "tool_choice": {"type": "auto"}},
    "tool_choice_any": {
        "messages": HI,
        "tools": [WEATHER],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
    },
    "tool_choice_tool": {
        "messages": HI,
        "tools": [WEATHER, TIME],
        "tool_choice": {"type": "tool", "name": "get_time"},
    },
    "tool_choice_none": {"messages": HI, "tools": [WEATHER], "tool_choice": {"type": "none"}},
    "sampling": {
        "messages": HI,
        "stop_sequences": ["END", "\n\n"],
        "temperature": 0.3,
        "top_p": 0.9,
        "top_k": 5,
        "metadata": {"user_id": "u1"},
    },
    "stream": {"messages": HI, "stream": True},
    "json_output": {
        "messages": HI,
        "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}},
    },
    "effort": {"messages": HI, "output_config": {"effort": "high"}},
    "thinking_disabled": {"messages": HI, "thinking": {"type": "disabled"}},
    "thinking_adaptive": {"messages": HI, "thinking": {"type": "adaptive", "display": "omitted"}},
    "thinking_budget": {
        "messages": HI,
        "max_tokens": 4096,
        "thinking": {"type": "enabled", "budget_tokens": 1500, "display": "summarized"},
    },
    "template_kwargs": {"messages": HI, "chat_template_kwargs": {"enable_thinking": False}},
    "tool_changes": {
        "messages": [
            {
                "role": "system",
                "content": [
                    {
                        "type": "tool_addition",
                        "tool": {"type": "tool_definition", "definition": TIME},
                    },
                    {
                        "type": "tool_removal",
                        "tool": {"type": "tool_reference", "name": "get_weather"},
                    },
                ],
            },
            *HI,
        ],
        "tools": [WEATHER],
    },
}


@pytest.fixture(scope="module")
def vllm():
    """vLLM's converter and its request models (vLLM's import takes seconds: once)."""
    from vllm.entrypoints.anthropic import protocol
    from vllm.entrypoints.anthropic.serving import AnthropicServingMessages

    return AnthropicServingMessages, protocol


def _theirs(vllm, body: dict, count: bool, merge: bool) -> dict:
    serving, protocol = vllm
    model = protocol.AnthropicCountTokensRequest if count else protocol.AnthropicMessagesRequest
    request = serving.to_chat_completion_request(
        model.model_validate(body), merge_inline_system=merge
    )
    fields = {
        "messages": request.messages,
        "tools": [t.model_dump() for t in request.tools] if request.tools else None,
        "tool_choice": request.tool_choice,
        "parallel_tool_calls": request.parallel_tool_calls,
        "reasoning_effort": request.reasoning_effort,
        "chat_template_kwargs": request.chat_template_kwargs,
        "response_format": request.response_format,
        "thinking_token_budget": request.thinking_token_budget,
    }
    if hasattr(request.tool_choice, "model_dump"):
        fields["tool_choice"] = request.tool_choice.model_dump()
    if request.response_format is not None:
        fields["response_format"] = request.response_format.model_dump(
            by_alias=True, exclude_none=True
        )
    if not count:
        fields.update(
            max_tokens=request.max_tokens,
            max_completion_tokens=request.max_completion_tokens,
            stop=request.stop,
            temperature=request.temperature,
            top_p=request.top_p,
            top_k=request.top_k,
            stream=request.stream,
        )
    return fields


def _ours(body: dict, count: bool, merge: bool) -> dict:
    model = CountTokensRequest if count else MessagesRequest
    request = to_chat_request(model.model_validate(body), merge_inline_system=merge)
    fields = {
        "messages": request.messages,
        "tools": request.tools,
        "tool_choice": request.tool_choice,
        "parallel_tool_calls": request.parallel_tool_calls,
        "reasoning_effort": request.reasoning_effort,
        "chat_template_kwargs": request.chat_template_kwargs,
        "response_format": None,
        "thinking_token_budget": request.thinking_token_budget,
    }
    if request.response_format is not None:
        fields["response_format"] = request.response_format.model_dump(
            by_alias=True, exclude_none=True
        )
    if not count:
        fields.update(
            max_tokens=request.max_tokens,
            max_completion_tokens=request.max_completion_tokens,
            stop=request.stop,
            temperature=request.temperature,
            top_p=request.top_p,
            top_k=request.top_k,
            stream=request.stream,
        )
    return fields


@pytest.mark.parametrize("merge", [False, True], ids=["inline", "merged"])
@pytest.mark.parametrize("count", [False, True], ids=["create", "count_tokens"])
@pytest.mark.parametrize("case", CASES)
def test_the_chat_request_is_vllm_s(vllm, case, count, merge):
    body = {"model": "m", **CASES[case]}
    if count:
        body = {k: v for k, v in body.items() if k in CountTokensRequest.model_fields}
    else:
        body.setdefault("max_tokens", 64)
    theirs = _theirs(vllm, body, count, merge)
    ours = _ours(body, count, merge)
    if not count:
        # vLLM sets stream on the request; we ask only the final usage (see convert._sampling)
        assert bool(ours.pop("stream")) == bool(theirs.pop("stream"))
    if theirs["tools"] is None and theirs["tool_choice"] is None:
        theirs["tool_choice"] = "none"  # chat's default without tools; vLLM leaves None
    assert ours == theirs


def test_thinking_disabled_sends_the_probed_effort():
    body = {"model": "m", "messages": HI, "max_tokens": 8, "thinking": {"type": "disabled"}}
    request = MessagesRequest.model_validate(body)
    assert to_chat_request(request, disabled_effort="low").reasoning_effort == "low"
    assert to_chat_request(request).reasoning_effort == "none"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"max_tokens": 0}, "max_tokens must be positive"),
        ({"max_tokens": 1024, "thinking": {"type": "enabled", "budget_tokens": 1024}}, "less than"),
        ({"max_tokens": 8, "tool_choice": {"type": "tool"}}, "tool_choice.name is required"),
        ({"max_tokens": 8, "stop_sequences": list("abcde")}, "at most 4"),
    ],
)
def test_request_checks_are_vllm_s(vllm, body, message):
    from pydantic import ValidationError

    body = {"model": "m", "messages": HI, **body}
    with pytest.raises(ValidationError, match=message):
        MessagesRequest.model_validate(body)
    with pytest.raises(ValidationError, match=message):
        vllm[1].AnthropicMessagesRequest.model_validate(body)


def test_an_image_source_is_a_url_or_base64_data():
    assert image_url({"type": "url", "url": "https://x.test/a.png"}) == "https://x.test/a.png"
    assert image_url(PNG) == "data:image/png;base64,iVBORw0KGgo="
    assert image_url({"data": "AAAA"}) == "data:image/jpeg;base64,AAAA"
