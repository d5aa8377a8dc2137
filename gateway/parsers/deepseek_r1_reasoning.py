"""``--reasoning-parser deepseek_r1``: vLLM 0.32's ``DeepSeekR1ReasoningParser``.

Behaviour reproduced (``vllm/reasoning/deepseek_r1_reasoning_parser.py`` and its base
``BaseThinkingReasoningParser``, as served by ``DelegatingParser``):

- Non-streaming: everything up to and including the first ``<think>`` is dropped; with no
  ``</think>`` the rest is all reasoning (``""`` rather than ``None`` when empty) and content is
  ``None``; otherwise reasoning is the text before the first ``</think>`` and content the text
  after it (``None`` when empty). Later ``<think>``/``</think>`` stay in the text.
- Streaming: each delta is classified on its own, knowing only whether ``<think>`` was seen
  before. vLLM tests token ids; a marker is one token, so "token in the delta" is "marker text in
  the delta" here. A delta that is exactly a marker sends nothing. A delta that starts reasoning
  with ``<think>`` and more text sends that text *with* the tag as reasoning (a vLLM quirk kept on
  purpose). Once a delta holds ``</think>``, later deltas are raw content.
"""

from __future__ import annotations

from gateway.parsers.base import DeltaMessage, ReasoningParser, ReasoningResult

THINK_START = "<think>"
THINK_END = "</think>"


def _reasoning_then_content(reasoning: str, content: str) -> DeltaMessage:
    return DeltaMessage(reasoning=reasoning, content=content or None)


class DeepSeekR1ReasoningParser(ReasoningParser):
    name = "deepseek_r1"
    start_marker = THINK_START
    end_marker = THINK_END

    def __init__(self) -> None:
        self._ended = False
        self._start_seen = False

    @property
    def reasoning_ended(self) -> bool:
        return self._ended

    def extract(self, text: str) -> ReasoningResult:
        before, tag, after = text.partition(THINK_START)
        text = after if tag else before
        if THINK_END not in text:
            return ReasoningResult(text, None)
        reasoning, _, content = text.partition(THINK_END)
        return ReasoningResult(reasoning, content or None)

    def feed(self, delta_text: str) -> DeltaMessage | None:
        if self._ended:
            return DeltaMessage(content=delta_text) if delta_text else None
        start_before = self._start_seen
        self._start_seen = start_before or THINK_START in delta_text
        # vLLM ends reasoning on the end token appearing in the delta, whatever else is there.
        self._ended = THINK_END in delta_text
        if delta_text in (THINK_START, THINK_END):
            return None
        return self._classify(delta_text, start_before)

    @staticmethod
    def _classify(delta: str, start_before: bool) -> DeltaMessage:
        end = delta.find(THINK_END)
        if start_before or THINK_START not in delta:
            if end == -1:
                return DeltaMessage(reasoning=delta)
            return _reasoning_then_content(delta[:end], delta[end + len(THINK_END) :])
        if end == -1:
            return DeltaMessage(reasoning=delta)
        start = delta.find(THINK_START) + len(THINK_START)
        return _reasoning_then_content(delta[start:end], delta[end + len(THINK_END) :])
