"""Routing policies: which of the eligible workers takes a request.

`round_robin`, `least_requests` (fewest requests assigned), `power_of_two` (the less loaded of
two picked at random) and `cache_aware`: the worker whose recent prompts share the longest
token-id prefix with this one (its engine likely holds that prefix in its KV cache), unless the
load is imbalanced beyond a threshold or the best match is short, when it balances instead.

Blocks are keyed as vLLM's prefix cache keys them (vllm/v1/core/kv_cache_utils.py): the block's
token ids chained on its parent's key, plus, for a block that overlaps a multimodal item's
placeholder range, that item's hash and where the item starts relative to the block. Two images
expand to the same placeholder tokens; without the item keys two prompts differing only in an
image would look identical, and the follow-up turn of an image chat would be a guess.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gateway.workers.kv_index import KvEventIndex

POLICIES = ("round_robin", "least_requests", "power_of_two", "cache_aware")
BLOCK_TOKENS = 16
# A multimodal item in a prompt: (offset, length) of its placeholder range in the expanded ids,
# and its hash (the `mm_hashes` entry the wire carries, vLLM's item identifier).
MmSpan = tuple[int, int, str]


@functools.lru_cache(maxsize=4096)
def item_key(identifier: str) -> int:
    """An item hash as an int that is the same in every process (`hash()` of a str is salted
    per process, and the gateway's processes must key blocks alike)."""
    return int.from_bytes(hashlib.blake2b(identifier.encode(), digest_size=8).digest(), "big")


def block_hashes(
    ids: Sequence[int], mm: Sequence[MmSpan] = (), block_tokens: int = BLOCK_TOKENS
) -> list[int]:
    """The chained keys of the full blocks of `ids`. A block overlapping items' placeholder
    ranges also hashes `(item_key(hash), offset - block_start)` of each, in offset order, as
    vLLM's `_gen_mm_extra_hash_keys` adds `("mm", identifier, offset - start)`: the same item
    at another position in otherwise identical blocks is another block."""
    spans = sorted(mm)
    hashes, previous, first = [], 0, 0
    for start in range(0, len(ids) - block_tokens + 1, block_tokens):
        end = start + block_tokens
        tokens = tuple(ids[start:end])
        while first < len(spans) and spans[first][0] + spans[first][1] <= start:
            first += 1  # items wholly before this block
        keys = []
        for offset, length, identifier in spans[first:]:
            if offset >= end:
                break
            if offset + length > start:
                keys.append((item_key(identifier), offset - start))
        previous = chain_key(previous, tokens, tuple(keys))
        hashes.append(previous)
    return hashes


def chain_key(previous: int, tokens: tuple[int, ...], keys: tuple = ()) -> int:
    """One block's key: its parent's, its token ids and its extra keys (a text-only block's
    key is the same as before item keys existed)."""
    return hash((previous, tokens, keys)) if keys else hash((previous, tokens))


class Routable(Protocol):
    url: str
    assigned: int


@dataclass(frozen=True)
class Decision:
    worker: Routable
    outcome: str  # "balanced", "cache_hit", "cache_miss", "imbalanced"
    matched_tokens: int = 0


class PrefixIndex:
    """Per worker, the chained hashes of the 16-token blocks of prompts it was sent (LRU),
    with when each was last sent."""

    def __init__(self, max_blocks_per_worker: int = 200_000) -> None:
        self.max_blocks = max_blocks_per_worker
        self._blocks: dict[str, OrderedDict[int, float]] = {}

    @staticmethod
    def block_hashes(ids: Sequence[int], mm: Sequence[MmSpan] = ()) -> list[int]:
        return block_hashes(ids, mm)

    def matched_blocks(self, url: str, hashes: Sequence[int], since: float = 0.0) -> int:
        """Leading blocks of `hashes` sent to `url` (at or after `since`, time.monotonic())."""
        blocks = self._blocks.get(url)
        if not blocks:
            return 0
        count = 0
        for block in hashes:
            if blocks.get(block, -1.0) < since:
                break
            count += 1
        return count

    def insert(self, url: str, hashes: Sequence[int]) -> None:
        blocks = self._blocks.setdefault(url, OrderedDict())
        now = time.monotonic()
        for block in hashes:
            blocks[block] = now
            blocks.move_to_end(block)
        while len(blocks) > self.max_blocks:
            blocks.popitem(last=False)

    def size(self, url: str) -> int:
        return len(self._blocks.get(url, ()))

    def forget(self, url: str) -> None:
        self._blocks.pop(url, None)


class Router:
    def __init__(
        self,
        policy: str = "round_robin",
        balance_threshold: int = 8,
        cache_threshold: float = 0.5,
        rng: random.Random | None = None,
        events: KvEventIndex | None = None,
        pending_seconds: float = 5.0,
    ) -> None:
        """`events`: what workers that publish KV events really hold (their match is then
        that, or the blocks sent to them in the last `pending_seconds`, whose events may not
        have arrived yet); other workers' match is the guess of what they were sent."""
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; one of {', '.join(POLICIES)}")
        self.policy = policy
        self.balance_threshold = balance_threshold
        self.cache_threshold = cache_threshold
        self.prefixes = PrefixIndex()
        self.events = events
        self.pending_seconds = pending_seconds
        # Told every insert into `prefixes`: several gateway processes pass them to each
        # other, so each routes a conversation's next turn where any of them sent the last.
        self.on_insert: Callable[[str, list[int]], None] | None = None
        self._turn = itertools.count()
        self._rng = rng or random.Random()

    def share_turns(self, turns: Iterator[int]) -> None:
        """Round-robin turns (and least-loaded rotation) from a counter several gateway
        processes share, so round robin goes round the workers once for all of them."""
        self._turn = turns

    def choose(
        self, workers: Sequence[Routable], prompt_ids: Sequence[int] = (), mm: Sequence[MmSpan] = ()
    ) -> Decision:
        """`mm`: the prompt's multimodal items (placeholder range and hash; see MmSpan)."""
        if self.policy == "cache_aware" and prompt_ids:
            return self._cache_aware(workers, prompt_ids, mm)
        return Decision(self._balanced(workers), "balanced")

    def _balanced(self, workers: Sequence[Routable]) -> Routable:
        if self.policy == "round_robin" or len(workers) == 1:
            return workers[next(self._turn) % len(workers)]
        if self.policy == "power_of_two":
            a, b = self._rng.sample(list(workers), 2)
            return a if a.assigned <= b.assigned else b
        return self._least_loaded(workers)

    def _least_loaded(self, workers: Sequence[Routable]) -> Routable:
        start = next(self._turn) % len(workers)  # rotate among equals
        rotated = [*workers[start:], *workers[:start]]
        return min(rotated, key=lambda w: (w.assigned, self.prefixes.size(w.url)))

    def _cache_aware(
        self, workers: Sequence[Routable], prompt_ids: Sequence[int], mm: Sequence[MmSpan]
    ) -> Decision:
        hashes = block_hashes(prompt_ids, mm)
        loads = [w.assigned for w in workers]
        if max(loads) - min(loads) > self.balance_threshold:
            decision = Decision(self._least_loaded(workers), "imbalanced")
        else:
            by_size = {BLOCK_TOKENS: hashes}
            matches = [self._matched(w.url, prompt_ids, mm, by_size) for w in workers]
            best = max(range(len(workers)), key=lambda i: (matches[i], -loads[i]))
            if hashes and matches[best] / len(hashes) >= self.cache_threshold:
                tokens = matches[best] * BLOCK_TOKENS
                decision = Decision(workers[best], "cache_hit", tokens)
            else:
                decision = Decision(self._least_loaded(workers), "cache_miss")
        self.prefixes.insert(decision.worker.url, hashes)
        if self.on_insert is not None:
            self.on_insert(decision.worker.url, hashes)
        return decision

    def _matched(
        self, url: str, ids: Sequence[int], mm: Sequence[MmSpan], by_size: dict[int, list[int]]
    ) -> int:
        """Leading 16-token blocks `url`'s engine holds: by its KV events where it publishes
        them (in its own block size), else by what it was sent."""
        hashes = by_size[BLOCK_TOKENS]
        if self.events is None or not self.events.following(url):
            return self.prefixes.matched_blocks(url, hashes)
        size = self.events.block_size(url) or BLOCK_TOKENS
        if size not in by_size:
            by_size[size] = block_hashes(ids, mm, size)
        held = self.events.matched_blocks(url, by_size[size]) * size // BLOCK_TOKENS
        pending = time.monotonic() - self.pending_seconds
        return max(held, self.prefixes.matched_blocks(url, hashes, since=pending))
