"""mmgate's own additions to the VllmEngine wire, carried in gRPC metadata.

The `.proto` files stay smg-grpc-proto 0.4.28's, field for field (ARCHITECTURE.md, "The wire";
tests/e2e/interop/test_protos.py compares the descriptors): a field of our own there could
collide with a number SMG assigns later, and would break SMG's descriptor equality. Metadata
is the channel the wire already has for what the messages do not carry (the W3C
`traceparent`), and a peer that does not know a key ignores it. Hence each addition is
advertised by the worker (GetServerInfo's trailing metadata, `mmgate-capabilities`) and the
gateway uses it only with a worker that advertised it: SMG's upstream servicer advertises
nothing, and a request needing an addition is refused rather than run without it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

# GetServerInfo trailing metadata: the additions this worker applies, comma-separated.
CAPABILITIES = "mmgate-capabilities"
# Generate call metadata: vLLM's SamplingParams.thinking_token_budget (decimal, >= 0). The
# capability is advertised only by a worker whose engine enforces it (a reasoning config).
THINKING_TOKEN_BUDGET = "mmgate-thinking-token-budget"
# Its capability name in CAPABILITIES.
ENFORCES_THINKING_BUDGET = "thinking_token_budget"


def capabilities_metadata(names: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """GetServerInfo's trailing metadata advertising `names` (none when empty)."""
    joined = ",".join(sorted(names))
    return ((CAPABILITIES, joined),) if joined else ()


def capabilities(metadata: Sequence[tuple[str, Any]] | None) -> frozenset[str]:
    """The additions a worker advertised; empty for a peer that sends no such metadata."""
    for key, value in metadata or ():
        if key == CAPABILITIES and isinstance(value, str):
            return frozenset(n.strip() for n in value.split(",") if n.strip())
    return frozenset()


def thinking_budget_metadata(budget: int | None) -> tuple[tuple[str, str], ...]:
    """Generate metadata carrying a request's thinking budget (none when unset)."""
    return () if budget is None else ((THINKING_TOKEN_BUDGET, str(budget)),)


def thinking_token_budget(metadata: Sequence[tuple[str, Any]] | None) -> int | None:
    """The thinking budget a Generate call carries, None when it carries none. A value that
    is not a non-negative decimal integer raises ValueError."""
    for key, value in metadata or ():
        if key == THINKING_TOKEN_BUDGET:
            text = value if isinstance(value, str) else ""
            if not (text.isascii() and text.isdigit()):
                raise ValueError(f"{THINKING_TOKEN_BUDGET} must be a non-negative integer")
            return int(text)
    return None
