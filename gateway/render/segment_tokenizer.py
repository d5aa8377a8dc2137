"""Prompt token ids with the text between added tokens cached, exactly as `Tokenizer.encode`.

Chat prompts repeat: a multi-turn chat resends its history, and system prompts recur across
requests. HF tokenizers (`AddedVocabulary::extract_and_normalize`, tokenizers 0.23) first
splits the raw input at the *non-normalized* added tokens (a leftmost-longest Aho-Corasick
match), and then normalizes, splits at the normalized added tokens, pre-tokenizes and runs the
model on each piece between them on its own. So `encode(text)` is the concatenation over those
pieces of `encode(piece)`, and a piece seen before can reuse its ids.

That holds only when nothing looks across a piece's edge or at its position, so a tokenizer
qualifies (decided once) only when:
- no non-normalized added token has lstrip, rstrip or single_word (they widen the match into
  the neighbouring text or skip it by what surrounds it); normalized ones only act inside a
  piece, which the library handles when it encodes that piece;
- the pre-tokenizer has no Metaspace with prepend_scheme "first" (it prepends only to the piece
  at offset 0 of the input, and every piece is at offset 0 when encoded alone);
- there is no truncation, padding, BPE dropout (random: a cache would freeze it) or
  `encode_special_tokens` (special tokens are then not split out);
- with add_special_tokens=True, the post-processor adds no ids (none, or ByteLevel); with
  False, post-processors never add ids.
Otherwise every call is the plain `encode_batch_fast` call. The decision holds as long as the
tokenizer is not changed afterwards (the gateway never changes it once loaded).
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from typing import Any

from tokenizers import Tokenizer

# A cached piece's ids stay as the list the library returned (~36 bytes a token; never
# mutated: `encode` copies them out), so 2M cached characters (0.5-0.8M tokens) hold
# 20-30 MB per gateway process.
DEFAULT_MAX_ENTRIES = 8192
DEFAULT_MAX_CHARS = 2_000_000


class SegmentTokenizer:
    """`encode(text, add_special_tokens)` == `tokenizer.encode(text, ...).ids`, with the pieces
    between added tokens kept in a bounded LRU cache keyed by the piece's text."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        max_chars: int = DEFAULT_MAX_CHARS,
    ) -> None:
        self.tokenizer = tokenizer
        self.max_entries = max_entries
        self.max_chars = max_chars
        self._cache: OrderedDict[str, list[int]] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()
        self._pattern: re.Pattern[str] | None = None
        self._token_ids: dict[str, list[int]] = {}
        self._adds_nothing = False  # add_special_tokens=True adds no ids
        try:
            config = json.loads(tokenizer.to_str())
        except Exception as error:  # a custom (Python) component cannot be serialized
            self.reason: str | None = f"not serializable: {error}"
        else:
            self.reason = _disqualified(tokenizer, config)
            if self.reason is None:
                self._prepare(config)

    @property
    def qualifies(self) -> bool:
        return self.reason is None

    def _prepare(self, config: dict[str, Any]) -> None:
        self._adds_nothing = _post_processor_adds_nothing(config.get("post_processor"))
        added = self.tokenizer.get_added_tokens_decoder().values()
        split_on = sorted(
            {t.content for t in added if not t.normalized},
            key=len,
            reverse=True,
        )
        if not split_on:
            self._pattern = re.compile("(?!)")  # matches nothing: the whole text is one piece
            return
        # Longest first: Python tries alternatives in order at the leftmost position, which
        # is the library's leftmost-longest match.
        self._pattern = re.compile("(" + "|".join(re.escape(t) for t in split_on) + ")")
        # The library's own ids for each token alone (an added token is always one split).
        encoded = self.tokenizer.encode_batch_fast(split_on, add_special_tokens=False)
        self._token_ids = {t: e.ids for t, e in zip(split_on, encoded, strict=True)}

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        pattern = self._pattern
        if pattern is None or (add_special_tokens and not self._adds_nothing):
            plain = self.tokenizer.encode_batch_fast([text], add_special_tokens=add_special_tokens)
            return plain[0].ids
        # With one capture group, split alternates piece, token, piece, ..., piece.
        parts = pattern.split(text)
        pieces = parts[0::2]
        found = self._lookup(pieces)
        out: list[int] = []
        token_ids = self._token_ids
        for i, part in enumerate(parts):
            if i & 1:
                out.extend(token_ids[part])
            elif part:
                out.extend(found[part])
        return out

    def _lookup(self, pieces: list[str]) -> dict[str, list[int]]:
        found: dict[str, list[int]] = {}
        missing: list[str] = []
        cache = self._cache
        with self._lock:
            for piece in pieces:
                if not piece or piece in found:
                    continue
                ids = cache.get(piece)
                if ids is None:
                    missing.append(piece)
                    found[piece] = []
                else:
                    cache.move_to_end(piece)
                    found[piece] = ids
        if not missing:
            return found
        # One call for every new piece: the per-call overhead is paid once.
        encoded = self.tokenizer.encode_batch_fast(missing, add_special_tokens=False)
        new = [(piece, e.ids) for piece, e in zip(missing, encoded, strict=True)]
        with self._lock:
            for piece, ids in new:
                found[piece] = ids
                self._store(piece, ids)
        return found

    def _store(self, piece: str, ids: list[int]) -> None:
        if len(piece) > self.max_chars // 4:  # one huge piece would flush everything else
            return
        cache = self._cache
        if piece in cache:  # another thread stored it meanwhile
            return
        cache[piece] = ids
        self._chars += len(piece)
        while len(cache) > self.max_entries or self._chars > self.max_chars:
            old, _ = cache.popitem(last=False)
            self._chars -= len(old)

    def cache_info(self) -> tuple[int, int]:
        """(entries, characters) held."""
        with self._lock:
            return len(self._cache), self._chars


def _disqualified(tokenizer: Tokenizer, config: dict[str, Any]) -> str | None:
    """Why piecewise encoding could differ from `encode` for this tokenizer, or None."""
    if getattr(tokenizer, "encode_special_tokens", False):
        return "encode_special_tokens is set"
    if config.get("truncation") is not None or config.get("padding") is not None:
        return "truncation or padding is set"
    if (config.get("model") or {}).get("dropout") not in (None, 0, 0.0):
        return "BPE dropout"
    for token in tokenizer.get_added_tokens_decoder().values():
        if not token.content:
            return "an empty added token"
        if not token.normalized and (token.lstrip or token.rstrip or token.single_word):
            return f"added token {token.content!r} has lstrip, rstrip or single_word"
    if _has_first_only_metaspace(config.get("pre_tokenizer")):
        return 'Metaspace prepend_scheme="first"'
    return None


def _has_first_only_metaspace(node: Any) -> bool:
    if isinstance(node, dict):
        if node.get("type") == "Metaspace" and node.get("prepend_scheme") == "first":
            return True
        return any(_has_first_only_metaspace(v) for v in node.values())
    if isinstance(node, list):
        return any(_has_first_only_metaspace(v) for v in node)
    return False


def _post_processor_adds_nothing(node: Any) -> bool:
    if node is None:
        return True
    if node.get("type") == "ByteLevel":
        return True
    if node.get("type") == "Sequence":
        return all(_post_processor_adds_nothing(p) for p in node.get("processors", []))
    return False
