"""Routing policies: which of the eligible workers takes a request.

`round_robin`, `least_requests` (fewest requests assigned), `power_of_two` (the less loaded of
two picked at random) and `cache_aware`: the worker whose recent prompts share the longest
token-id prefix with this one (its engine likely holds that prefix in its KV cache), unless the
load is imbalanced beyond a threshold or the best match is short, when it balances instead.
"""

from __future__ import annotations

import itertools
import random
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

POLICIES = ("round_robin", "least_requests", "power_of_two", "cache_aware")
BLOCK_TOKENS = 16


class Routable(Protocol):
    url: str
    assigned: int


@dataclass(frozen=True)
class Decision:
    worker: Routable
    outcome: str  # "balanced", "cache_hit", "cache_miss", "imbalanced"
    matched_tokens: int = 0


class PrefixIndex:
    """Per worker, the chained hashes of the 16-token blocks of prompts it was sent (LRU)."""

    def __init__(self, max_blocks_per_worker: int = 200_000) -> None:
        self.max_blocks = max_blocks_per_worker
        self._blocks: dict[str, OrderedDict[int, None]] = {}

    @staticmethod
    def block_hashes(ids: Sequence[int]) -> list[int]:
        hashes, previous = [], 0
        for start in range(0, len(ids) - BLOCK_TOKENS + 1, BLOCK_TOKENS):
            previous = hash((previous, tuple(ids[start : start + BLOCK_TOKENS])))
            hashes.append(previous)
        return hashes

    def matched_blocks(self, url: str, hashes: Sequence[int]) -> int:
        blocks = self._blocks.get(url)
        if not blocks:
            return 0
        count = 0
        for block in hashes:
            if block not in blocks:
                break
            count += 1
        return count

    def insert(self, url: str, hashes: Sequence[int]) -> None:
        blocks = self._blocks.setdefault(url, OrderedDict())
        for block in hashes:
            blocks[block] = None
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
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; one of {', '.join(POLICIES)}")
        self.policy = policy
        self.balance_threshold = balance_threshold
        self.cache_threshold = cache_threshold
        self.prefixes = PrefixIndex()
        # Told every insert into `prefixes`: several gateway processes pass them to each
        # other, so each routes a conversation's next turn where any of them sent the last.
        self.on_insert: Callable[[str, list[int]], None] | None = None
        self._turn = itertools.count()
        self._rng = rng or random.Random()

    def share_turns(self, turns: Iterator[int]) -> None:
        """Round-robin turns (and least-loaded rotation) from a counter several gateway
        processes share, so round robin goes round the workers once for all of them."""
        self._turn = turns

    def choose(self, workers: Sequence[Routable], prompt_ids: Sequence[int] = ()) -> Decision:
        if self.policy == "cache_aware" and prompt_ids:
            return self._cache_aware(workers, prompt_ids)
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

    def _cache_aware(self, workers: Sequence[Routable], prompt_ids: Sequence[int]) -> Decision:
        hashes = PrefixIndex.block_hashes(prompt_ids)
        loads = [w.assigned for w in workers]
        if max(loads) - min(loads) > self.balance_threshold:
            decision = Decision(self._least_loaded(workers), "imbalanced")
        else:
            matches = [self.prefixes.matched_blocks(w.url, hashes) for w in workers]
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
