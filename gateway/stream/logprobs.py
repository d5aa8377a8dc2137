"""Logprobs in the OpenAI shapes, with the token strings vLLM's server shows.

vLLM's output processor names each logprob token by decoding it alone
(`convert_ids_list_to_tokens`: HF `decode([id])`, leading spaces restored for Metaspace
tokenizers) and, when that ends in U+FFFD (a piece of a multi-byte character), decodes it again
behind up to four preceding *sampled* tokens and keeps the new text (`_correct_decoded_token`).
This module ports both (vllm/tokenizers/detokenizer_utils.py, vllm/v1/engine/logprobs.py).

The wire's top list for a position is the engine entry's first k items (the sampled token, then
the top tokens by rank), as smg-grpc-servicer and our worker send it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from tokenizers import Tokenizer

from gateway.stream.detokenizer import decode_prompt

REPLACEMENT = "\ufffd"
MAX_CONTEXT = 4
FLOOR = -9999.0  # what OpenAI (and vLLM) print instead of -inf


@dataclass(frozen=True)
class Position:
    """One generated position: the sampled token, its logprob and the top list."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]


class TokenTexts:
    def __init__(self, tokenizer: Tokenizer, clean_up_spaces: bool = False) -> None:
        self.tokenizer = tokenizer
        self.clean_up_spaces = clean_up_spaces
        self.marker = leading_space_marker(tokenizer)
        self._single: dict[int, str] = {}

    def decode(self, ids: Sequence[int]) -> str:
        return decode_prompt(self.tokenizer, ids, self.clean_up_spaces)

    def single(self, token: int) -> str:
        text = self._single.get(token)
        if text is None:
            text = self.decode([token])
            if self.marker is not None:
                raw = self.tokenizer.id_to_token(token) or ""
                text = _restore_leading_spaces(raw, text, self.marker)
            self._single[token] = text
        return text

    def in_context(self, token: int, context: Sequence[int]) -> str:
        """The name of `token` at a position preceded by the sampled tokens `context`."""
        text = self.single(token)
        return self._corrected(token, context) if text.endswith(REPLACEMENT) else text

    def _corrected(self, token: int, context: Sequence[int]) -> str:
        context = list(context[-MAX_CONTEXT:])
        for size in range(1, len(context) + 1):
            window = context[-size:]
            full = self.decode([*window, token])
            if full.endswith(REPLACEMENT):
                continue
            clean_end = len(window)
            for j in range(len(window) - 1, -1, -1):
                if self.decode([window[j]]).endswith(REPLACEMENT):
                    clean_end = j
                else:
                    break
            prefix = self.decode(window[:clean_end]) if clean_end > 0 else ""
            if full.startswith(prefix):
                return full[len(prefix) :]
            common = 0
            for a, b in zip(prefix, full):
                if a != b:
                    break
                common += 1
            return full[common:]
        return ""


def leading_space_marker(tokenizer: Tokenizer) -> str | None:
    """The Metaspace replacement character, if the pre-tokenizer has one (vLLM's rule)."""
    pre = json.loads(tokenizer.to_str()).get("pre_tokenizer") or {}
    candidates = [pre, *pre.get("pretokenizers", [])] if pre.get("type") == "Sequence" else [pre]
    for item in candidates:
        if item.get("type") == "Metaspace":
            return item.get("replacement", "\u2581")
    return None


def _restore_leading_spaces(raw: str, text: str, marker: str) -> str:
    markers = len(raw) - len(raw.lstrip(marker))
    if markers == 0:
        return text
    missing = markers - (len(text) - len(text.lstrip(" ")))
    return " " * missing + text if missing > 0 else text


def _entry(name: str, value: float) -> dict:
    return {
        "token": name,
        "logprob": max(value, FLOOR),
        "bytes": list(name.encode("utf-8", errors="replace")),
    }


def chat_logprobs(texts: TokenTexts, positions: Sequence[Position], top: int) -> dict:
    """`choice.logprobs` of a chat completion (or of one stream chunk, with `context`)."""
    return {"content": chat_content(texts, positions, top, [])}


def chat_content(
    texts: TokenTexts, positions: Sequence[Position], top: int, context: list[int]
) -> list[dict]:
    """Entries for `positions`; `context` (the sampled tokens before them) grows as it goes."""
    content = []
    for position in positions:
        name = texts.in_context(position.token, context)
        tops = [_entry(texts.in_context(t, context), v) for t, v in position.top[: max(top, 0)]]
        content.append({**_entry(name, position.logprob), "top_logprobs": tops})
        context.append(position.token)
    return content


def completion_logprobs(
    texts: TokenTexts,
    positions: Sequence[Position],
    top: int,
    text_offset: int = 0,
    context: list[int] | None = None,
) -> dict:
    """`choice.logprobs` of a completion: tokens, token_logprobs, top_logprobs, text_offset.

    vLLM lists the entry's first top+1 items (its `>=`); the wire carries the first `top`, so
    when a sampled token is outside the top ones, vLLM shows one more alternative than this.
    """
    tokens: list[str] = []
    values: list[float] = []
    tops: list[dict[str, float]] = []
    offsets: list[int] = []
    context = [] if context is None else context
    for position in positions:
        name = texts.in_context(position.token, context)
        offsets.append(text_offset if not offsets else offsets[-1] + len(tokens[-1]))
        tokens.append(name)
        values.append(max(position.logprob, FLOOR))
        tops.append(
            {texts.in_context(t, context): max(v, FLOOR) for t, v in position.top[: top + 1]}
        )
        context.append(position.token)
    return {
        "text_offset": offsets,
        "token_logprobs": values,
        "tokens": tokens,
        "top_logprobs": tops,
    }
