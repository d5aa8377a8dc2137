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
from dataclasses import dataclass
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


# Generate call metadata: vLLM's SamplingParams.allowed_token_ids (comma-separated decimal ids),
# the only tokens the engine may sample. Whisper's language detection, as vLLM's speech-to-text
# server runs it, restricts its one token to the language tokens: a logit bias cannot do that
# exactly (vLLM clamps biases to +-100). Every mmgate engine advertises it.
ALLOWED_TOKEN_IDS = "mmgate-allowed-token-ids"
# Its capability name in CAPABILITIES.
TAKES_ALLOWED_TOKEN_IDS = "allowed_token_ids"

# The worker takes audio the gateway preprocessed: mm_inputs of modality AUDIO (Whisper
# features, their int32 mask, Omni's lengths; engine_server/mm_inputs.py lays them out).
# Every mmgate engine advertises it. SMG's upstream servicer does not take them (it answers
# 400 "Unsupported proto tensor dtype: 'int32'", and would read them as images): a gateway
# preprocesses audio only for workers that advertise this, and on auto refers the clips to
# the worker (media_refs) when none does.
TAKES_AUDIO_MM_INPUTS = "audio_mm_inputs"


def allowed_token_ids_metadata(ids: Sequence[int] | None) -> tuple[tuple[str, str], ...]:
    """Generate metadata restricting sampling to `ids` (none when None)."""
    return () if ids is None else ((ALLOWED_TOKEN_IDS, ",".join(map(str, ids))),)


def allowed_token_ids(metadata: Sequence[tuple[str, Any]] | None) -> list[int] | None:
    """The allowed token ids a Generate call carries, None when it carries none. A value that
    is not a non-empty list of non-negative decimal integers raises ValueError."""
    for key, value in metadata or ():
        if key == ALLOWED_TOKEN_IDS:
            parts = value.split(",") if isinstance(value, str) else [""]
            if not all(p.isascii() and p.isdigit() for p in parts):
                raise ValueError(f"{ALLOWED_TOKEN_IDS} must be comma-separated token ids")
            return [int(p) for p in parts]
    return None


# ---- send each item once (issue 29): the worker keeps preprocessed items by hash ----
# Its capability name in CAPABILITIES; GetServerInfo's trailing metadata then also carries the
# byte bound of one sender's share of the cache, how many senders' shares it keeps at once,
# and the id of this cache's life (a new one after a restart), so that the gateway notices a
# worker whose cache is empty however it came back.
MM_ITEM_CACHE = "mm_item_cache"
MM_CACHE_BYTES = "mmgate-mm-cache-bytes"
MM_CACHE_SENDERS = "mmgate-mm-cache-senders"
MM_CACHE_INSTANCE = "mmgate-mm-cache-instance"
# Generate call metadata, comma-separated item hashes (the wire's mm_hashes). CACHED_ITEMS:
# items whose tensors this request leaves out (the worker takes them from its cache); STORE:
# items sent in full that the worker is to keep; EVICT: items the worker is to drop. The
# instance says which cache life the sender's mirror describes. Several gateways (processes,
# replicas) send to one worker, each with its own mirror: the worker keeps one partition per
# SENDER (an id each gateway process makes at start), and PARTITION numbers the sender's
# mirrors (a new mirror, after its partition was lost, gets a higher one) so that the worker
# tells a mirror whose partition it dropped from a new one.
CACHED_ITEMS = "mmgate-cached-items"
MM_STORE = "mmgate-mm-store"
MM_EVICT = "mmgate-mm-evict"
MM_SENDER = "mmgate-mm-sender"
MM_PARTITION = "mmgate-mm-partition"
# The worker's answer when a request names cached items it does not hold (or mirrors another
# cache life): FAILED_PRECONDITION with this message, which names them all (the gateway's own
# gRPC client reads status messages, not trailing metadata). It says `partition=gone` when
# the worker holds no partition for the sender's mirror (dropped for another sender, flushed):
# the sender then forgets everything, not only the items named.
MM_CACHE_MISS = "mmgate-mm-cache-miss"


@dataclass(frozen=True)
class ItemCacheInfo:
    """A worker's advertised item cache: one sender's byte bound (its share), how many
    senders' shares it keeps at once, and this life's id."""

    max_bytes: int
    instance: str
    senders: int = 1


@dataclass(frozen=True)
class ItemCacheCall:
    """What a Generate call tells the worker's item cache, for the partition of `sender`
    that its mirror number `partition` describes."""

    instance: str
    cached: tuple[str, ...] = ()
    store: tuple[str, ...] = ()
    evict: tuple[str, ...] = ()
    sender: str = ""
    partition: int = 0


@dataclass(frozen=True)
class CacheMiss:
    """A worker's refusal: these items are not in its cache, whose life is `instance`;
    `gone`: it holds nothing for the sender's mirror any more."""

    instance: str
    missing: tuple[str, ...]
    gone: bool = False


def item_cache_metadata(info: ItemCacheInfo) -> tuple[tuple[str, str], ...]:
    """GetServerInfo's trailing metadata for the cache (next to CAPABILITIES)."""
    return (
        (MM_CACHE_BYTES, str(info.max_bytes)),
        (MM_CACHE_SENDERS, str(info.senders)),
        (MM_CACHE_INSTANCE, info.instance),
    )


def item_cache_info(metadata: Sequence[tuple[str, Any]] | None) -> ItemCacheInfo | None:
    """The advertised cache, None unless the worker advertised the capability with a bound."""
    values = {k: v for k, v in metadata or () if isinstance(v, str)}
    size, instance = values.get(MM_CACHE_BYTES, ""), values.get(MM_CACHE_INSTANCE, "")
    if MM_ITEM_CACHE not in capabilities(metadata) or not (size.isascii() and size.isdigit()):
        return None
    senders = values.get(MM_CACHE_SENDERS, "1")
    senders = int(senders) if senders.isascii() and senders.isdigit() and int(senders) else 1
    return ItemCacheInfo(int(size), instance, senders) if int(size) > 0 and instance else None


def item_cache_call_metadata(call: ItemCacheCall) -> tuple[tuple[str, str], ...]:
    out = [(MM_CACHE_INSTANCE, call.instance), (MM_PARTITION, str(call.partition))]
    if call.sender:
        out.append((MM_SENDER, call.sender))
    for key, hashes in (
        (CACHED_ITEMS, call.cached),
        (MM_STORE, call.store),
        (MM_EVICT, call.evict),
    ):
        if hashes:
            out.append((key, ",".join(hashes)))
    return tuple(out)


def item_cache_call(metadata: Sequence[tuple[str, Any]] | None) -> ItemCacheCall | None:
    """What a Generate call tells the item cache; None when it says nothing (a sender that
    does not use the cache: every item arrives in full and nothing is kept). A partition
    number that is not a non-negative decimal integer raises ValueError."""
    values = {k: v for k, v in metadata or () if isinstance(v, str)}
    if MM_CACHE_INSTANCE not in values:
        return None

    def hashes(key: str) -> tuple[str, ...]:
        return tuple(h for h in values.get(key, "").split(",") if h)

    partition = values.get(MM_PARTITION, "0")
    if not (partition.isascii() and partition.isdigit()):
        raise ValueError(f"{MM_PARTITION} must be a non-negative integer")
    return ItemCacheCall(
        values[MM_CACHE_INSTANCE],
        hashes(CACHED_ITEMS),
        hashes(MM_STORE),
        hashes(MM_EVICT),
        values.get(MM_SENDER, ""),
        int(partition),
    )


def cache_miss_message(miss: CacheMiss) -> str:
    gone = " partition=gone" if miss.gone else ""
    return f"{MM_CACHE_MISS} instance={miss.instance} missing={','.join(miss.missing)}{gone}"


def cache_miss(message: str | None) -> CacheMiss | None:
    """The miss a FAILED_PRECONDITION's message reports, None for any other message."""
    if not message or not message.startswith(MM_CACHE_MISS + " "):
        return None
    fields = dict(part.partition("=")[::2] for part in message.split()[1:])
    missing = tuple(h for h in fields.get("missing", "").split(",") if h)
    return CacheMiss(fields.get("instance", ""), missing, fields.get("partition") == "gone")
