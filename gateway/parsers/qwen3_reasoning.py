"""``--reasoning-parser qwen3``: vLLM 0.32's Qwen3 parser engine, reasoning part only.

Behaviour reproduced (``vllm/parser/qwen3.py`` grammar, as served by ``DelegatingParser``):

- Output starts in reasoning: the ``<think>`` start tag is optional (templates that put it in
  the prompt) and every ``<think>`` inside reasoning is dropped.
- ``</think>`` ends reasoning. ``<tool_call>`` also ends it (an implicit end); the tag is then
  kept as content so a tool parser can read it.
- A text with no end is all reasoning, content ``None``; empty parts are ``None``.
- Non-streaming, every later ``</think>`` is dropped from content. Streaming, only those in the
  delta that ended reasoning are: vLLM passes later deltas through as raw content.
- Streaming finds markers within a delta only: vLLM matches them by token id, and a marker is
  one token, so it never straddles two deltas.
- ``chat_template_kwargs`` ``enable_thinking: false``: no reasoning at all, the whole output is
  content (vLLM builds its parser from the request's template kwargs).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from gateway.parsers.base import DeltaMessage, ParserContext, ReasoningParser, ReasoningResult

THINK_START = "<think>"
THINK_END = "</think>"
TOOL_CALL_START = "<tool_call>"
_MARKERS = (THINK_START, THINK_END, TOOL_CALL_START)
TURN_BOUNDARIES = frozenset(("<|im_start|>", "<|im_end|>"))


def _next_marker(text: str) -> tuple[int, str] | None:
    found = [(i, m) for m in _MARKERS if (i := text.find(m)) != -1]
    return min(found) if found else None


def _split(text: str) -> tuple[str, str | None, str]:
    """(reasoning, content or None if reasoning has not ended, unscanned tail)."""
    reasoning: list[str] = []
    pos = 0
    while (hit := _next_marker(text[pos:])) is not None:
        offset, marker = hit
        reasoning.append(text[pos : pos + offset])
        pos += offset + len(marker)
        if marker == THINK_START:
            continue
        # The content keeps <tool_call> (the tool parser needs it) but never a stray </think>.
        rest = (TOOL_CALL_START if marker == TOOL_CALL_START else "") + text[pos:]
        return "".join(reasoning), rest.replace(THINK_END, ""), ""
    return "".join(reasoning), None, text[pos:]


class Qwen3ReasoningParser(ReasoningParser):
    name = "qwen3"
    start_marker = THINK_START
    end_marker = THINK_END
    keeps_special_tokens = True  # vLLM's parser-engine adapters always turn skipping off
    engine_based = True

    def __init__(self, thinking: bool = True) -> None:
        self.thinking = thinking
        self._ended = not thinking

    @classmethod
    def for_request(cls, context: ParserContext) -> Qwen3ReasoningParser:
        return cls(thinking=bool(context.chat_template_kwargs.get("enable_thinking", True)))

    @property
    def reasoning_ended(self) -> bool:
        return self._ended

    def prompt_ends_reasoning(self, prompt_tokens: Sequence[str]) -> bool:
        # vLLM's ParserEngine.is_reasoning_end: the scan stops at the turn's start, and a turn
        # without markers has ended reasoning only when the parser does not wait for it.
        for token in reversed(prompt_tokens):
            if token == THINK_END:
                return True
            if token == THINK_START:
                return False
            if token in TURN_BOUNDARIES:
                break
        return not self.thinking

    def count_reasoning_tokens(self, token_texts: Sequence[str], specials: Collection[str]) -> int:
        # vLLM's parser engine counts the text tokens it classifies as reasoning: not the
        # markers (terminals matched by token id), nor special tokens. It reads the end by
        # token: a marker spelt in pieces does not end it. (Streamed, vLLM's count also drops
        # a token whose delta came out empty, a character's first bytes, unless the engine
        # happened to send it with the next one: that count depends on timing; this is the
        # whole reply's.)
        if not self.thinking:
            return 0
        count = 0
        for token in token_texts:
            if token in (THINK_END, TOOL_CALL_START):
                break
            count += token != THINK_START and token not in specials
        return count

    def extract(self, text: str) -> ReasoningResult:
        if not self.thinking:
            return ReasoningResult(None, text)
        reasoning, content, tail = _split(text)
        return ReasoningResult(reasoning + tail or None, content or None)

    def feed(self, delta_text: str) -> DeltaMessage | None:
        if self._ended:
            return DeltaMessage(content=delta_text) if delta_text else None
        reasoning, content, tail = _split(delta_text)
        self._ended = content is not None
        reasoning += tail
        if not reasoning and not content:
            return None
        return DeltaMessage(reasoning=reasoning or None, content=content or None)
