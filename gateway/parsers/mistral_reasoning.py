"""``--reasoning-parser mistral``: vLLM 0.32's ``MistralParserReasoningAdapter``
(``vllm/reasoning/mistral_reasoning_parser.py``, over ``MistralParser`` in
``vllm/parser/mistral.py``), reasoning part only.

Reasoning is ``[THINK]...[/THINK]`` (Magistral; special tokens in the vocabulary). The engine is
``gateway.parsers.mistral_tool.MistralEngine`` served as a reasoning parser
(``marker_engine.adapters.EngineReasoningParser``, tool parsing off, as ``DelegatingParser``
runs it):

- Output starts as content; ``[THINK]`` opens reasoning (a repeated one is dropped),
  ``[/THINK]`` closes it; ``[TOOL_CALLS]`` also ends it and stays in the content for the tool
  parser, even when no reasoning was open. A ``[/THINK]`` in content is dropped (streaming:
  until reasoning has ended; later deltas pass through raw).
- Reasoning is stripped of trailing whitespace, ``None`` when empty; content ``None`` when empty.
- Streaming: until reasoning ends, deltas go through the engine (whitespace-only content held
  back until text or the end); the delta that ends it returns the rest of its text as content,
  and later deltas are passed through raw. A stream that never ends reasoning is flushed at the
  end (a trailing partial marker included, not stripped). Markers count when whole inside one
  delta (vLLM matches them by token id).
- A vocabulary without ``[THINK]`` (``think_tokens=False``) has no reasoning: everything is
  content from the start, as in vLLM.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from gateway.parsers.base import ParserContext
from gateway.parsers.marker_engine.adapters import EngineReasoningParser
from gateway.parsers.mistral_tool import THINK_END, THINK_START, TOOL_CALLS, MistralEngine


class MistralReasoningParser(EngineReasoningParser):
    name = "mistral"
    start_marker = THINK_START
    end_marker = THINK_END

    @classmethod
    def for_request(cls, context: ParserContext) -> MistralReasoningParser:
        # vLLM reads reasoning only when the vocabulary has the [THINK] token.
        return cls(think_tokens=THINK_START in context.vocab)

    def __init__(self, *, think_tokens: bool = True) -> None:
        # prompt_ends_reasoning (the engine's is_reasoning_end): the last of [THINK] /
        # [/THINK] / [TOOL_CALLS] decides, so an earlier turn's tool call counts as an end;
        # no marker: not ended. Without [THINK] reasoning has always ended.
        self._think_tokens = think_tokens
        super().__init__(MistralEngine(think=think_tokens))

    def count_reasoning_tokens(self, token_texts: Sequence[str], specials: Collection[str]) -> int:
        # vLLM's engine counts the text tokens it reads inside [THINK]...[/THINK], not the
        # markers, special tokens, or tokens that brought no text; from a tool call on it
        # reads only the call.
        if not self._think_tokens:
            return 0
        count, inside = 0, False
        for token in token_texts:
            if token == TOOL_CALLS:
                break
            if token in (THINK_START, THINK_END):
                inside = token == THINK_START
            elif inside and token and token not in specials:
                count += 1
        return count
