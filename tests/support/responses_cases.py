"""Forced outputs and tools for the Responses API tests on the tiny Qwen3 tool model
(`tests.support.qwen3_tools_model`), as tests/e2e/gateway/test_tool_calls.py forces chat
replies: a `structured_outputs` choice makes the model write exactly a text, and a strong bias
towards the marker tokens keeps a grammar from spelling a marker in pieces."""

from __future__ import annotations

import functools
import json
from typing import Any

from tests.support.qwen3_tools_model import CHAT_TEMPLATE, MARKERS

# Responses tools are flat: {"type": "function", "name", "parameters", ...}.
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": False,
}
# Strict: a grammar holds a forced call's arguments to the schema, so a random model's call
# stays short. Forced texts need tools that are not strict (vLLM would add the calls' grammar).
STRICT_WEATHER = {**WEATHER, "strict": True}
TIME = {
    "type": "function",
    "name": "get_time",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}},
    "strict": False,
}


def call_text(city: str) -> str:
    body = json.dumps({"name": "get_weather", "arguments": {"city": city}}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


PARIS, TOKYO = call_text("Paris"), call_text("Tokyo")


@functools.cache
def marker_bias(markers: tuple[str, ...] = MARKERS) -> dict[str, float]:
    """A strong bias towards the marker tokens (vLLM's streamed reasoning parser goes by
    token id, its whole-reply one by text: a marker spelled in pieces would split them)."""
    from engine_server.tiny_models import qwen_tokenizer

    first = len(qwen_tokenizer(CHAT_TEMPLATE))  # the markers follow the tiny vocabulary
    return {str(first + MARKERS.index(m)): 30.0 for m in markers}


def forced(text: str, **body: Any) -> dict[str, Any]:
    """The extra body fields that make the model write exactly ``text`` (EOS after it)."""
    return {"structured_outputs": {"choice": [text]}, "logit_bias": marker_bias(), **body}


@functools.cache
def call_bias() -> dict[str, float]:
    """A bias that makes a grammar-driven call (tool_choice required or named) the call of
    `PARIS`: its tokens favoured, whitespace-only tokens barred (a grammar admits any amount
    of whitespace between JSON tokens, which a random model fills its output with)."""
    from engine_server.tiny_models import qwen_tokenizer

    tokenizer = qwen_tokenizer(CHAT_TEMPLATE)
    blank = [i for i in tokenizer.get_vocab().values() if not tokenizer.decode([i]).strip()]
    wanted = tokenizer.encode(PARIS, add_special_tokens=False)
    return {
        **{str(i): -100.0 for i in blank},
        **marker_bias(),
        **{str(i): 30.0 for i in wanted},
    }


def grammar_driven(**body: Any) -> dict[str, Any]:
    """Extra body fields for a call the request's own grammar drives (tool_choice)."""
    return {"logit_bias": call_bias(), **body}
