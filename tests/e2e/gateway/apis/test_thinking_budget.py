"""A thinking budget through `mmgate serve` equals vLLM's own server, where vLLM's engine
enforces it (the session's tiny Qwen3 model, qwen3 reasoning parser on both): chat's
`thinking_token_budget`, streamed and not, and the Messages API's `thinking.budget_tokens`.

The budget only counts inside a thought, and this model never opens one itself: the prompts end
inside one (an assistant turn continued after `<think>`, or a user turn ending in `<think>`), so
the engine forces `</think>` once the budget is spent and the model goes on as content. Without
a budget the same prompt is thought to the end (the control), so a budget that did not reach
the engine fails the test.
"""

from __future__ import annotations

from typing import Any

import anthropic
import openai

BUDGET = 3
CHAT = {
    "messages": [
        {"role": "user", "content": "Where is Paris?"},
        {"role": "assistant", "content": "<think>\nParis"},
    ],
    "max_tokens": 12,
    "temperature": 0,
}
CHAT_EXTRA = {"continue_final_message": True, "add_generation_prompt": False}


# vLLM's server writes no prompt_tokens_details without --enable-prompt-tokens-details; mmgate
# always does (the cached tokens), a difference not of this feature.
USAGE = ("prompt_tokens", "completion_tokens", "total_tokens", "completion_tokens_details")


def _usage(usage: Any) -> dict[str, Any]:
    given = usage.model_dump(exclude_none=True)
    return {k: given.get(k) for k in USAGE}


def _chat(url: str, model: str, budget: int | None, stream: bool) -> dict[str, Any]:
    """What a client reads: reasoning, content, finish reason and usage."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=120)
    extra = {**CHAT_EXTRA, **({"thinking_token_budget": budget} if budget is not None else {})}
    if not stream:
        reply = client.chat.completions.create(model=model, extra_body=extra, **CHAT)
        message = reply.choices[0].message.model_dump()
        return {
            "reasoning": message.get("reasoning"),
            "content": message["content"],
            "finish_reason": reply.choices[0].finish_reason,
            "usage": _usage(reply.usage),
        }
    chunks = client.chat.completions.create(
        model=model,
        extra_body=extra,
        stream=True,
        stream_options={"include_usage": True},
        **CHAT,
    )
    reasoning, content, finish, usage = "", "", None, None
    for chunk in chunks:
        if chunk.usage is not None:
            usage = _usage(chunk.usage)
        for choice in chunk.choices:
            delta = choice.delta.model_dump()
            reasoning += delta.get("reasoning") or ""
            content += delta.get("content") or ""
            finish = choice.finish_reason or finish
    return {
        "reasoning": reasoning or None,
        "content": content or None,
        "finish_reason": finish,
        "usage": usage,
    }


def test_chat_thinking_token_budget_equals_vllm(api_stack):
    peers = ((api_stack.vllm_url, "tiny"), (api_stack.mmgate_url, str(api_stack.model)))
    for stream in (False, True):
        theirs, ours = (_chat(url, model, BUDGET, stream) for url, model in peers)
        assert ours == theirs, stream
        # the engine closed the thought at once (the prompt's thought spent the budget) and
        # the model went on as content
        assert theirs["content"], theirs
    control = _chat(api_stack.mmgate_url, str(api_stack.model), None, False)
    assert control["content"] is None and control["reasoning"], control


def _message(url: str, model: str, thinking: dict[str, Any] | None) -> dict[str, Any]:
    client = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0, timeout=300)
    extra = {"thinking": thinking} if thinking is not None else {}
    message = client.messages.create(
        model=model,
        max_tokens=1030,
        messages=[{"role": "user", "content": "Where is Paris? <think>"}],
        extra_body={"temperature": 0},  # not typed by this SDK version
        **extra,
    )
    blocks = [
        ("thinking", b.thinking) if b.type == "thinking" else (b.type, getattr(b, "text", None))
        for b in message.content
    ]
    usage = (message.usage.input_tokens, message.usage.output_tokens)
    return {"content": blocks, "stop_reason": message.stop_reason, "usage": usage}


def test_messages_thinking_budget_equals_vllm(api_stack):
    """budget_tokens is at least 1024 (Anthropic's and vLLM's bound): the thought runs that
    long, then the engine closes it and the rest of max_tokens is text."""
    thinking = {"type": "enabled", "budget_tokens": 1024}
    theirs = _message(api_stack.vllm_url, "tiny", thinking)
    ours = _message(api_stack.mmgate_url, str(api_stack.model), thinking)
    assert ours == theirs
    assert [kind for kind, _ in theirs["content"]] == ["thinking", "text"], theirs["content"]


def test_an_invalid_budget_is_vllm_s_400(api_stack):
    peers = ((api_stack.vllm_url, "tiny"), (api_stack.mmgate_url, str(api_stack.model)))
    errors = []
    for url, model in peers:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        try:
            client.chat.completions.create(
                model=model, extra_body={"thinking_token_budget": -2}, **CHAT
            )
        except openai.BadRequestError as error:
            body = error.body if "message" in error.body else error.body["error"]
            errors.append((body["message"], body["param"]))
    assert len(errors) == 2 and errors[0] == errors[1], errors
