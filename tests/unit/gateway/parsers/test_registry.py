"""Parser lookup by vLLM's names."""

from __future__ import annotations

import pytest

from gateway.parsers import UnknownParserError, reasoning_parser, tool_parser


def test_known_names_give_fresh_instances() -> None:
    assert reasoning_parser("qwen3").name == "qwen3"
    assert reasoning_parser("deepseek_r1").name == "deepseek_r1"
    assert tool_parser("hermes") is not tool_parser("hermes")
    assert tool_parser("qwen3_json").name == "hermes"


def test_unknown_name_lists_known_ones() -> None:
    with pytest.raises(UnknownParserError, match="unknown reasoning parser 'r2'; known: .*qwen3"):
        reasoning_parser("r2")
    with pytest.raises(UnknownParserError, match="unknown tool call parser 'x'; known: .*hermes"):
        tool_parser("x")
