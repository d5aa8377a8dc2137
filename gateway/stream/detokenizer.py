"""Token ids back to text on the gateway, as vLLM's own detokenizer produces it.

A port of vLLM 0.32's FastIncrementalDetokenizer and stop-string rules
(vllm/v1/engine/detokenizer.py): tokenizers' DecodeStream primed with the prompt, the same
special-token spacing, stop strings searched only in new text, honouring min_tokens, the
text cut at the stop (or after it with include_stop_str_in_output), and the token that
triggered a stop-token finish left out of the text. Streaming differs only in *when* text is
released: a tail that could still grow into a stop string is held back, and nothing else, so
multi-byte characters (DecodeStream emits nothing until they are whole) and stop strings
never leak across chunks.
"""

from __future__ import annotations

import json
import sys
from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

INVALID_PREFIX = "Invalid prefix encountered"
# How many of the prompt's last ids prime a byte-level decoder (see `priming_ids`).
PRIME_TOKENS = 32
_BYTEWISE: dict[int, tuple[Tokenizer, bool]] = {}


@dataclass(frozen=True)
class TextOptions:
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    stop: tuple[str, ...] = ()
    include_stop_str_in_output: bool = False
    min_tokens: int = 0


def find_stop(
    text: str, new_chars: int, stop: Sequence[str], include: bool
) -> tuple[str, int] | None:
    """vLLM's check_stop_strings: (stop string, length to cut the text to, -1 for none)."""
    if not new_chars or not stop:
        return None
    best, best_index, best_end = None, 0, sys.maxsize
    for candidate in stop:
        index = text.find(candidate, 1 - new_chars - len(candidate))
        if index != -1 and index + len(candidate) < best_end:
            best, best_index, best_end = candidate, index, index + len(candidate)
    if best is None:
        return None
    if include:
        end = best_index + len(best)
        return best, (-1 if end >= len(text) else end)
    return best, best_index


class IncrementalText:
    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_ids: Sequence[int],
        options: TextOptions,
        added_tokens: Mapping[int, str],
    ) -> None:
        self._tokenizer = tokenizer
        self._options = options
        self._stream = DecodeStream(
            ids=priming_ids(tokenizer, prompt_ids, options.skip_special_tokens),
            skip_special_tokens=options.skip_special_tokens,
        )
        self._raw_specials = not (
            options.skip_special_tokens or options.spaces_between_special_tokens
        )
        self._added = added_tokens
        self._last_special = False
        self.token_ids: list[int] = []
        # The text's length after each token: where one token's text ends and the next begins.
        self._ends: list[int] = []
        self.text = ""
        self._released = 0

    def update(self, new_ids: Sequence[int], stop_terminated: bool = False) -> str | None:
        """Add the engine's new ids; returns the stop string when one matched."""
        if not new_ids:
            return None
        ids = list(new_ids)
        skipped = None
        if stop_terminated and not self._options.include_stop_str_in_output:
            skipped = ids.pop()
        before = len(self.token_ids)
        offsets = [len(self.text)]
        for token in ids:
            self.token_ids.append(token)
            self.text += self._decode_next(token)
            self._ends.append(len(self.text))
            offsets.append(len(self.text))
        if skipped is not None:
            self.token_ids.append(skipped)
            offsets.append(len(self.text))
        return self._check_stop(offsets, before)

    def _check_stop(self, offsets: list[int], before: int) -> str | None:
        opts = self._options
        if not opts.stop or len(self.token_ids) <= opts.min_tokens:
            return None
        start = offsets[max(opts.min_tokens - before, 0)]
        found = find_stop(
            self.text, len(self.text) - start, opts.stop, opts.include_stop_str_in_output
        )
        if found is None:
            return None
        stop, cut = found
        end = len(self.text) if cut == -1 else cut
        if not opts.include_stop_str_in_output:
            end += len(stop)
        kept = bisect_left(offsets, end, lo=1)
        del self.token_ids[before + kept :]
        if cut != -1:
            self.text = self.text[:cut]
        return stop

    def release(self, finished: bool) -> str:
        """New text that is safe to send: all of it once finished, else all but a stop prefix."""
        end = len(self.text) if finished else len(self.text) - self._stop_prefix_length()
        if end <= self._released:
            return ""
        delta, self._released = self.text[self._released : end], end
        return delta

    def release_pieces(self, finished: bool) -> list[str]:
        """``release``, cut where one token's text ends: the deltas vLLM's server streams one
        token at a time (its output parsers see them one by one)."""
        start = self._released
        delta = self.release(finished)
        if not delta:
            return []
        end = start + len(delta)
        cuts = [start]
        for cut in self._ends[bisect_right(self._ends, start) :]:
            if cut >= end:
                break
            if cut > cuts[-1]:
                cuts.append(cut)
        cuts.append(end)
        return [self.text[a:b] for a, b in zip(cuts, cuts[1:])]

    def _stop_prefix_length(self) -> int:
        if not self._options.stop or self._options.include_stop_str_in_output:
            return 0
        longest = 0
        for stop in self._options.stop:
            for size in range(min(len(stop) - 1, len(self.text)), longest, -1):
                if self.text.endswith(stop[:size]):
                    longest = size
                    break
        return longest

    def _decode_next(self, token: int) -> str:
        piece = self._step(token)
        if self._raw_specials:
            special = self._added.get(token)
            if special is not None and self._last_special:
                piece = special
            self._last_special = special is not None
        return piece or ""

    def _step(self, token: int) -> str | None:
        try:
            return self._stream.step(self._tokenizer, token)
        except (OverflowError, TypeError):
            return None
        except Exception as error:
            if not str(error).startswith(INVALID_PREFIX):
                raise
            # Non-monotonic UTF-8 from some tokenizers breaks the stream; vLLM restarts it.
            self._stream = DecodeStream(skip_special_tokens=self._options.skip_special_tokens)
            return self._stream.step(self._tokenizer, token)


def priming_ids(tokenizer: Tokenizer, prompt_ids: Sequence[int], skip_special: bool) -> list[int]:
    """The prompt ids to prime the DecodeStream with: the whole prompt, as vLLM does, or just
    its tail where that gives the same text.

    A primed stream's first step decodes everything it was primed with, twice (0.15 ms for an
    800-token prompt, most of a 16-token answer's detokenizing); after it only that step's own
    ids are kept. Its text is decode(P + t) minus decode(P), or the whole of decode(P + t)
    when decode(P) ends in U+FFFD (the stream then has no prefix). A ByteLevel decoder maps
    each token to bytes on its own and reads their concatenation as lossy UTF-8, which starts
    afresh after each whole character. So when a tail S of P decodes to text that does not end
    in U+FFFD, S ends on the same whole character as P, and the first step's text is t's own
    bytes read from there, the same from S as from P. Otherwise (another decoder, an empty or
    U+FFFD-ending tail) the whole prompt is used."""
    if len(prompt_ids) <= PRIME_TOKENS or not _decodes_bytewise(tokenizer):
        return list(prompt_ids)
    tail = list(prompt_ids[-PRIME_TOKENS:])
    text = tokenizer.decode(tail, skip_special_tokens=skip_special)
    if not text or text.endswith("\ufffd"):
        return list(prompt_ids)
    return tail


def _decodes_bytewise(tokenizer: Tokenizer) -> bool:
    """Whether the decoder is ByteLevel alone (Qwen, Llama 3, DeepSeek, GPT-2 ...); decided
    once per tokenizer (the gateway never changes one once loaded)."""
    known = _BYTEWISE.get(id(tokenizer))
    if known is not None and known[0] is tokenizer:
        return known[1]
    try:
        decoder = json.loads(tokenizer.to_str()).get("decoder") or {}
    except Exception:  # a custom (Python) component cannot be serialized
        decoder = {}
    bytewise = decoder.get("type") == "ByteLevel"
    _BYTEWISE[id(tokenizer)] = (tokenizer, bytewise)  # holds it: no id reused
    return bytewise


_CLEANUPS = (
    (" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"),
    (" n't", "n't"), (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"),
)  # fmt: skip


def decode_prompt(tokenizer: Tokenizer, ids: Sequence[int], clean_up_spaces: bool = False) -> str:
    """transformers' `tokenizer.decode(ids)` (what vLLM uses for prompts): specials kept,
    and the tokenizer config's clean_up_tokenization_spaces applied."""
    text = tokenizer.decode(list(ids), skip_special_tokens=False)
    if clean_up_spaces:
        for before, after in _CLEANUPS:
            text = text.replace(before, after)
    return text
