"""mmgate's wire additions in gRPC metadata: what one side writes the other reads back, and
what a peer that knows none of them sends (nothing) reads as none."""

from __future__ import annotations

import pytest

from protos import extensions


@pytest.mark.parametrize("budget", [0, 3, 1024, 10**12])
def test_a_thinking_budget_reads_back(budget):
    metadata = extensions.thinking_budget_metadata(budget)
    assert extensions.thinking_token_budget([("traceparent", "00-x"), *metadata]) == budget


def test_no_budget_sends_no_metadata():
    assert extensions.thinking_budget_metadata(None) == ()
    assert extensions.thinking_token_budget(None) is None
    assert extensions.thinking_token_budget([("traceparent", "00-x")]) is None


@pytest.mark.parametrize("value", ["-1", "3.0", "", " 3", "x", "٣", b"3"])
def test_a_malformed_budget_is_refused(value):
    with pytest.raises(ValueError, match="non-negative integer"):
        extensions.thinking_token_budget([(extensions.THINKING_TOKEN_BUDGET, value)])


def test_capabilities_read_back_and_a_silent_peer_has_none():
    names = {extensions.ENFORCES_THINKING_BUDGET, "later"}
    metadata = extensions.capabilities_metadata(names)
    assert extensions.capabilities([("x", "y"), *metadata]) == names
    assert extensions.capabilities_metadata(set()) == ()
    assert extensions.capabilities(None) == frozenset()
    assert extensions.capabilities([("x", "y")]) == frozenset()


def test_allowed_token_ids_round_trip() -> None:
    metadata = extensions.allowed_token_ids_metadata([5, 17, 4093])
    assert extensions.allowed_token_ids([("x", "y"), *metadata]) == [5, 17, 4093]
    assert extensions.allowed_token_ids_metadata(None) == ()
    assert extensions.allowed_token_ids([("x", "y")]) is None
    for bad in ("", "1,,2", "-1", "1.5", "a"):
        with pytest.raises(ValueError):
            extensions.allowed_token_ids([(extensions.ALLOWED_TOKEN_IDS, bad)])
