"""No request field is accepted and dropped: every field of vLLM's chat and completion
requests is either taken by the gateway or refused with a 400 naming it when asked for (set to
anything but vLLM's default). Read from vLLM's own request models, so a field vLLM adds shows
up here."""

from __future__ import annotations

import pytest

from gateway.api.protocol import UNSUPPORTED, ChatCompletionRequest, CompletionRequest
from gateway.errors import GatewayError, parse_body

MESSAGES = [{"role": "user", "content": "hi"}]
# OpenAI's end-user tag: vLLM ignores it as well.
IGNORED_BY_VLLM_TOO = {"user"}


def _vllm_models():
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest as Chat
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest as Completion

    return {ChatCompletionRequest: Chat, CompletionRequest: Completion}


@pytest.mark.parametrize(
    "ours", [ChatCompletionRequest, CompletionRequest], ids=lambda m: m.__name__
)
def test_every_vllm_field_is_taken_or_refused(ours):
    theirs = _vllm_models()[ours]
    dropped = set(theirs.model_fields) - set(ours.model_fields) - set(ours.REFUSED)
    assert dropped <= IGNORED_BY_VLLM_TOO, sorted(dropped)


def _body(model, **fields) -> dict:
    base = {"messages": MESSAGES} if model is ChatCompletionRequest else {"prompt": "hi"}
    return {**base, **fields}


ASKED = {
    "cache_salt": "salt",
    "documents": [{"title": "t", "text": "x"}],
    "length_penalty": 0.5,
    "mm_payload": "none",
    "priority": 3,
    "return_token_ids": True,
    "return_tokens_as_token_ids": True,
    "truncation_side": "right",
    "vllm_xargs": {"a": 1},
    "use_beam_search": True,
}


@pytest.mark.parametrize("field", sorted(ASKED))
@pytest.mark.parametrize(
    "model", [ChatCompletionRequest, CompletionRequest], ids=lambda m: m.__name__
)
def test_asking_for_what_is_not_done_is_a_400_naming_it(model, field):
    with pytest.raises(GatewayError) as refused:
        parse_body(model, _body(model, **{field: ASKED[field]}))
    assert refused.value.status == 400
    assert refused.value.param == field
    assert "not supported" in refused.value.message


@pytest.mark.parametrize("field", sorted(UNSUPPORTED))
def test_vllms_defaults_are_taken(field):
    for not_asked in UNSUPPORTED[field]:
        parse_body(ChatCompletionRequest, _body(ChatCompletionRequest, **{field: not_asked}))


def test_chat_echo_and_completion_add_special_tokens():
    parse_body(ChatCompletionRequest, _body(ChatCompletionRequest, echo=False))
    with pytest.raises(GatewayError, match="echo"):
        parse_body(ChatCompletionRequest, _body(ChatCompletionRequest, echo=True))
    parse_body(CompletionRequest, _body(CompletionRequest, echo=True))  # completions echo
    parse_body(CompletionRequest, _body(CompletionRequest, add_special_tokens=True))
    with pytest.raises(GatewayError, match="add_special_tokens"):
        parse_body(CompletionRequest, _body(CompletionRequest, add_special_tokens=False))
