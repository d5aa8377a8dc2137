"""The request checks and output rules of gateway.parsers.request_adjust and .delegating that
need no engine (the parsed replies themselves are compared with vLLM's server in
tests/e2e/gateway)."""

from __future__ import annotations

import pytest

from gateway.api.protocol import ChatCompletionRequest
from gateway.errors import GatewayError, parse_body
from gateway.parsers.config import ParsingConfig, TokenizerVocab
from gateway.parsers.request_adjust import plan_parsing

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
MESSAGES = [{"role": "user", "content": "hi"}]
ACTIVE = ParsingConfig(
    reasoning_parser="qwen3", tool_call_parser="hermes", enable_auto_tool_choice=True
)


def _plan(config: ParsingConfig, **fields):
    request = parse_body(ChatCompletionRequest, {"messages": MESSAGES, **fields})
    return request, plan_parsing(
        config, request, lambda: ["<|im_start|>", "assistant"], TokenizerVocab()
    )


def test_tool_choice_defaults_as_in_vllm():
    assert _plan(ParsingConfig())[0].tool_choice == "none"
    assert _plan(ACTIVE, tools=TOOLS)[0].tool_choice == "auto"


@pytest.mark.parametrize(
    ("choice", "message"),
    [
        ("auto", '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser'),
        ("required", 'tool_choice="required" requires --tool-call-parser to be set'),
        ({"type": "function", "function": {"name": "f"}}, 'tool_choice=function "f" requires'),
    ],
)
def test_tool_choices_need_a_parser(choice, message):
    config = ParsingConfig(tool_call_parser="hermes")  # no --enable-auto-tool-choice
    with pytest.raises(GatewayError, match=message):
        _plan(config, tools=TOOLS, tool_choice=choice)


def test_tools_with_choice_none_need_no_parser():
    request, plan = _plan(ParsingConfig(), tools=TOOLS, tool_choice="none")
    assert plan is None and request.skip_special_tokens


def test_parsers_keep_special_tokens_and_force_the_grammar():
    request, plan = _plan(ACTIVE, tools=TOOLS, tool_choice="required")
    assert plan is not None and not request.skip_special_tokens
    assert request.structured_outputs is not None
    assert '"tags_with_separator"' in request.structured_outputs.structural_tag


def test_finish_reasons_follow_vllm():
    _, required = _plan(ACTIVE, tools=TOOLS, tool_choice="required")
    _, named = _plan(
        ACTIVE, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "f"}}
    )
    _, auto = _plan(ACTIVE, tools=TOOLS)
    assert required.finish_reason(False, "stop", streamed=False) == "tool_calls"
    assert required.finish_reason(False, "stop", streamed=True) == "stop"
    assert named.finish_reason(True, "stop", streamed=True) == "stop"
    assert auto.finish_reason(True, "stop", streamed=False) == "tool_calls"
    assert auto.finish_reason(True, "length", streamed=False) == "length"
    assert (required.message_content(None), auto.message_content(None)) == ("", None)


def test_gpt_oss_reads_harmony_by_default():
    config = ParsingConfig(tool_call_parser="openai", enable_auto_tool_choice=True)
    assert config.for_model("gpt_oss").reasoning_parser == "openai_gptoss"
    assert config.for_model("qwen3").reasoning_parser is None
