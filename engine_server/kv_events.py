"""vLLM's KV cache events (`--kv-events-config`, ZMQ) relayed as the `SubscribeKvEvents` stream.

vLLM's engine core publishes every scheduler step's cache changes on a ZMQ PUB socket per
data-parallel rank (`tcp://*:5557` + rank by default): frames `[topic, seq (8 bytes big-endian),
msgpack [ts, events, rank]]`, events as tagged maps (`BlockStored`, `BlockRemoved`,
`AllBlocksCleared`), and keeps the last `buffer_steps` batches for a ROUTER replay endpoint.
This module subscribes to each rank and turns the batches into the smg-grpc-proto messages, by
the rules the upstream servicer (smg-grpc-servicer 0.14, `kv_relay.py`) applies, so SMG and our
gateway read our engine's stream as they read vLLM's own gRPC server's:

- each batch keeps its rank's own publisher sequence number and carries its `dp_rank` (the
  subscriber keeps one cursor per rank);
- a gap is filled from the rank's replay endpoint before anything later is forwarded; a gap
  that cannot be filled (no replay endpoint, history rolled, timeout) or a sequence that goes
  back (the publisher restarted) ends the stream with DATA_LOSS, which a subscriber answers by
  clearing the worker and subscribing again;
- nothing is kept between calls, so a non-zero `start_sequence_number` is refused with
  OUT_OF_RANGE and a zero one is live only;
- `medium` maps to a tier (and `cache_level` for older consumers), only local blocks and
  main-attention cache groups are forwarded, per-block `extra_keys` go out as
  `KvBlockExtraKey`s (multimodal items as `(identifier, offset)`: the item's hash and where it
  starts relative to the block), and the cache salt is read from them as upstream reads it.

Not carried over from upstream: engine-hash verification (a debugging counter), namespace
inheritance from a parent block for stores that omit it, and load records on the stream
(`EngineLoad`): subscribers keep polling `GetLoads`, as they do with any servicer without them.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import msgspec

from protos import common_pb2

log = logging.getLogger("mmgate.engine.kv_events")

_U64 = (1 << 64) - 1
_END_SEQ = _U64.to_bytes(8, "big")  # vLLM's END_SEQ: (-1) as 8 signed bytes
MAIN_ATTENTION_KINDS = ("full_attention", "mla_attention", "sink_full_attention")
_TIER_BY_MEDIUM = {
    "GPU": common_pb2.KV_CACHE_TIER_DEVICE,
    "DEVICE": common_pb2.KV_CACHE_TIER_DEVICE,
    "CPU": common_pb2.KV_CACHE_TIER_HOST,
    "CPU_PINNED": common_pb2.KV_CACHE_TIER_HOST,
    "DISK": common_pb2.KV_CACHE_TIER_DISK,
    "STORAGE": common_pb2.KV_CACHE_TIER_DISK,
    "EXTERNAL": common_pb2.KV_CACHE_TIER_EXTERNAL,
    "REMOTE": common_pb2.KV_CACHE_TIER_EXTERNAL,
}
# Tier -> KvBlock.cache_level (absent on the device).
_CACHE_LEVEL = {
    common_pb2.KV_CACHE_TIER_HOST: 1,
    common_pb2.KV_CACHE_TIER_DISK: 2,
    common_pb2.KV_CACHE_TIER_EXTERNAL: 3,
}
# Field order of vLLM's structs, for the tag-first array encoding of older publishers.
_STORED_SLOTS = (
    "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
    "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window",
    "locality", "ownership", "session_id",
)  # fmt: skip
_REMOVED_SLOTS = ("block_hashes", "medium", "group_idx", "locality", "ownership")
DISABLED = (
    "KV cache events are not published by this worker: start it with --kv-events-config "
    '\'{"enable_kv_cache_events": true, "publisher": "zmq"}\''
)


class RelayFailure(Exception):
    """The stream can no longer be trusted: the subscriber must clear and subscribe again."""


@dataclass(frozen=True)
class RankSource:
    rank: int
    endpoint: str  # where to SUBscribe
    replay_endpoint: str | None = None


def resolve_config(engine: Any) -> Any | None:
    """The engine's KVEventsConfig when it publishes over ZMQ, else None."""
    config = getattr(getattr(engine, "vllm_config", None), "kv_events_config", None)
    if config is None or not config.enable_kv_cache_events or config.publisher != "zmq":
        return None
    return config


def connectable(endpoint: str, rank: int = 0) -> str:
    """A bind endpoint as an address to connect to: wildcards become loopback, and a tcp port
    moves by the rank as vLLM's publisher moves it (`offset_endpoint_port`)."""
    resolved = endpoint.replace("*", "127.0.0.1").replace("0.0.0.0", "127.0.0.1")
    if rank and resolved.startswith("tcp://"):
        host, _, port = resolved.rpartition(":")
        if port.isdigit() and int(port) != 0:
            return f"{host}:{int(port) + rank}"
    if rank and resolved.startswith("inproc://"):
        return f"{resolved}_dp{rank}"
    return resolved


def rank_sources(config: Any, engine: Any) -> list[RankSource]:
    """One source per data-parallel rank: the engine client's report of each ready engine
    core's publisher (its endpoints already offset), else `data_parallel_size` ranks offset
    from the configured endpoints."""
    reported: dict = {}
    getter = getattr(engine, "get_kv_event_sources", None)
    if callable(getter):
        try:
            reported = dict(getter() or {})
        except Exception as error:  # noqa: BLE001 - discovery is best effort
            log.warning("get_kv_event_sources failed; ranks from the config: %s", error)
    if reported:
        return [
            RankSource(
                rank,
                connectable(cfg.endpoint),
                connectable(cfg.replay_endpoint) if cfg.replay_endpoint else None,
            )
            for rank, cfg in sorted(reported.items())
            if cfg.endpoint
        ]
    parallel = getattr(getattr(engine, "vllm_config", None), "parallel_config", None)
    size = getattr(parallel, "data_parallel_size", 1) or 1
    replay = config.replay_endpoint
    return [
        RankSource(
            rank, connectable(config.endpoint, rank), connectable(replay, rank) if replay else None
        )
        for rank in range(size)
    ]


# ---- decoding and normalization ----

_decoder = msgspec.msgpack.Decoder()


def fold_hash(value: object) -> int | None:
    """An engine block hash as the proto's signed 64-bit identity (vLLM sends the low 64 bits
    of the digest unsigned; a raw digest folds to its last 8 bytes, the integer vLLM would
    have sent); None if unreadable."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        masked = value & _U64
    elif isinstance(value, (bytes, bytearray)):
        masked = int.from_bytes(bytes(value)[-8:], "big")
    else:
        return None
    return masked - (1 << 64) if masked >= 1 << 63 else masked


def _extra_key(value: object) -> common_pb2.KvBlockExtraKey | None:
    """One of vLLM's untagged extra keys: a LoRA name or cache salt (text), an mm item
    `(identifier, offset)`, a prompt-embedding digest (bytes); None for shapes not modelled."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        return common_pb2.KvBlockExtraKey(text=value)
    if isinstance(value, int):
        return common_pb2.KvBlockExtraKey(number=value) if -(2**63) <= value < 2**63 else None
    if isinstance(value, (bytes, bytearray)):
        return common_pb2.KvBlockExtraKey(blob=bytes(value))
    if (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and isinstance(value[0], str)
        and isinstance(value[1], int)
        and not isinstance(value[1], bool)
    ):
        key = common_pb2.KvMultimodalKey(identifier=value[0], offset=value[1])
        return common_pb2.KvBlockExtraKey(multimodal=key)
    return None


def _fields(raw: object) -> tuple[str, dict[str, Any]] | None:
    """An event's tag and fields, from a tagged map or a tag-first array."""
    if isinstance(raw, dict):
        kind = raw.get("type")
        return (kind, raw) if isinstance(kind, str) else None
    if isinstance(raw, (list, tuple)) and raw and isinstance(raw[0], str):
        slots = {"BlockStored": _STORED_SLOTS, "BlockRemoved": _REMOVED_SLOTS}.get(raw[0], ())
        return raw[0], dict(zip(slots, raw[1:]))
    return None


class Normalizer:
    """One stream's conversion of vLLM events to `KvCacheEvent`s, with the cache groups it has
    learned per rank (a removal names only its group index)."""

    def __init__(self) -> None:
        self.event_id = 0
        self.groups: dict[tuple[int, int], bool] = {}  # (rank, group) -> main attention
        self.dropped: dict[str, int] = {}

    def batch(self, payload: bytes, seq: int, rank: int) -> common_pb2.KvEventBatch:
        """A publisher payload as its proto batch (an undecodable one as an empty batch under
        its sequence, so the subscriber sees no gap for it)."""
        proto = common_pb2.KvEventBatch(sequence_number=seq, dp_rank=rank)
        try:
            raw = _decoder.decode(payload)
            if not isinstance(raw, (list, tuple)) or len(raw) < 2:
                raise ValueError("not [ts, events, rank]")
            ts, events = raw[0], raw[1]
        except (msgspec.DecodeError, ValueError) as error:
            log.warning("KV event batch %d of rank %d undecodable: %s", seq, rank, error)
            return proto
        if isinstance(ts, (int, float)) and not isinstance(ts, bool):
            proto.timestamp = float(ts)
        for raw_event in events if isinstance(events, (list, tuple)) else ():
            self.event_id += 1  # once per event, forwarded or not (ids stay monotonic)
            event = self.event(raw_event, rank)
            if event is not None:
                proto.events.append(event)
        return proto

    def event(self, raw: object, rank: int) -> common_pb2.KvCacheEvent | None:
        parsed = _fields(raw)
        if parsed is None:
            return self._drop("malformed")
        kind, fields = parsed
        event_id = self.event_id
        if kind == "AllBlocksCleared":
            self.groups = {k: v for k, v in self.groups.items() if k[0] != rank}
            return common_pb2.KvCacheEvent(event_id=event_id, cleared=common_pb2.KvCacheCleared())
        if kind not in ("BlockStored", "BlockRemoved"):
            return self._drop("unknown_type")
        hashes = [fold_hash(h) for h in fields.get("block_hashes") or ()]
        if not hashes or None in hashes:
            return self._drop("malformed")
        if (fields.get("locality") or "LOCAL").upper() != "LOCAL":
            return self._drop("non_local_locality")
        medium = fields.get("medium")
        tier = _TIER_BY_MEDIUM.get(medium.upper()) if isinstance(medium, str) else None
        if medium is None:
            tier = common_pb2.KV_CACHE_TIER_DEVICE
        if tier is None:
            return self._drop("unknown_medium")
        group = fields.get("group_idx")
        if isinstance(group, int):
            spec = fields.get("kv_cache_spec_kind")
            if kind == "BlockStored" and isinstance(spec, str):
                self.groups[(rank, group)] = spec in MAIN_ATTENTION_KINDS
            if not self.groups.get((rank, group), True):
                return self._drop("non_main_attention_group")
        if kind == "BlockRemoved":
            removed = common_pb2.KvBlocksRemoved(
                block_hashes=hashes, tier=tier, locality=common_pb2.KV_CACHE_LOCALITY_LOCAL
            )
            if tier in _CACHE_LEVEL:
                removed.cache_level = _CACHE_LEVEL[tier]
            _set_optional(
                removed, medium=medium, group_idx=group, ownership=fields.get("ownership")
            )
            return common_pb2.KvCacheEvent(event_id=event_id, removed=removed)
        stored = self._stored(fields, hashes, tier)
        return None if stored is None else common_pb2.KvCacheEvent(event_id=event_id, stored=stored)

    def _stored(self, fields: dict, hashes: list, tier: int) -> common_pb2.KvBlocksStored | None:
        tokens = fields.get("token_ids") or []
        # Eagle-family speculative decoding publishes [token, next_token] cells: the token.
        tokens = [t[0] if isinstance(t, (list, tuple)) and t else t for t in tokens]
        width = fields.get("block_size")
        if not isinstance(width, int) or width <= 0 or len(hashes) * width != len(tokens):
            return self._drop("unaligned_blocks")
        if not all(isinstance(t, int) and 0 <= t < 2**32 for t in tokens):
            return self._drop("malformed")
        lora_name = fields.get("lora_name") or None
        lora_id = fields.get("lora_id")
        extra = fields.get("extra_keys") or []
        blocks = []
        for index, block_hash in enumerate(hashes):
            block = common_pb2.KvBlock(
                block_hash=block_hash,
                token_ids=tokens[index * width : (index + 1) * width],
                block_size=width,
            )
            if isinstance(lora_id, int) and not isinstance(lora_id, bool):
                block.lora_id = fold_hash(lora_id)
            if tier in _CACHE_LEVEL:
                block.cache_level = _CACHE_LEVEL[tier]
            keys = extra[index] if index < len(extra) else None
            for key in keys or ():
                if (converted := _extra_key(key)) is not None:
                    block.extra_keys.append(converted)
            blocks.append(block)
        stored = common_pb2.KvBlocksStored(
            blocks=blocks, tier=tier, locality=common_pb2.KV_CACHE_LOCALITY_LOCAL
        )
        parent = fold_hash(fields.get("parent_block_hash"))
        if parent is not None:
            stored.parent_block_hash = parent
        _set_optional(
            stored,
            medium=fields.get("medium"),
            group_idx=fields.get("group_idx"),
            kv_cache_spec_kind=fields.get("kv_cache_spec_kind"),
            kv_cache_spec_sliding_window=fields.get("kv_cache_spec_sliding_window"),
            ownership=fields.get("ownership"),
            session_id=fields.get("session_id"),
            lora_name=lora_name,
            cache_salt=fields.get("cache_salt") or _salt(extra, lora_name),
        )
        return stored

    def _drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1
        return None


def _salt(extra_keys: list, lora_name: str | None) -> str | None:
    """vLLM's cache salt, which it publishes only among block 0's extra keys: the first text
    key there that is not the LoRA name."""
    first = extra_keys[0] if extra_keys else None
    for key in first or ():
        if isinstance(key, str) and key and key != lora_name:
            return key
    return None


def _set_optional(message: Any, **values: Any) -> None:
    for name, value in values.items():
        if value is None or isinstance(value, bool):
            continue
        try:
            setattr(message, name, value)
        except (TypeError, ValueError):  # a value of the wrong type or range: left out
            continue


# ---- streaming ----


async def replay(
    ctx: Any, endpoint: str, start: int, timeout: float
) -> AsyncIterator[tuple[int, bytes]]:
    """Every batch a publisher's replay ROUTER still holds from `start` on: the request is
    `[b"", start]` on a DEALER, the replies `[b"", topic, seq, payload]` ending with END_SEQ.
    The first must be `start` itself and the rest contiguous, else RelayFailure."""
    import zmq

    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    try:
        dealer.connect(endpoint)
        await dealer.send_multipart([b"", start.to_bytes(8, "big")])
        expected = start
        while True:
            if not await dealer.poll(timeout=int(timeout * 1000)):
                raise RelayFailure(f"KV event replay from {endpoint} timed out at {expected}")
            frames = await dealer.recv_multipart()
            if len(frames) not in (3, 4) or len(frames[-2]) != 8:
                raise RelayFailure(f"malformed KV event replay reply ({len(frames)} frames)")
            if frames[-2] == _END_SEQ:
                if expected == start:
                    raise RelayFailure(f"the replay history at {endpoint} no longer holds {start}")
                return
            seq = int.from_bytes(frames[-2], "big")
            if seq != expected:
                raise RelayFailure(f"KV event replay skipped from {expected} to {seq}")
            yield seq, frames[-1]
            expected += 1
    except zmq.ZMQError as error:
        raise RelayFailure(f"KV event replay failed: {error}") from error
    finally:
        dealer.close(linger=0)


class _Rank:
    def __init__(self, source: RankSource) -> None:
        self.source = source
        self.cursor: int | None = None
        # The range the last replay forwarded: live batches queued meanwhile arrive below the
        # cursor and are duplicates, not a restarted publisher, until the live stream passes it.
        self.replayed: tuple[int, int] | None = None


async def relay(
    sources: Iterable[RankSource],
    *,
    topic: str = "",
    hwm: int | None = None,
    stopped: Callable[[], bool] = lambda: False,
    poll_seconds: float = 1.0,
    replay_timeout: float = 5.0,
    ready: Callable[[], Any] | None = None,
) -> AsyncIterator[common_pb2.KvEventBatch]:
    """Every rank's batches as one stream, each under its rank's own sequence number, until
    `stopped()` (checked at least every `poll_seconds`). `ready` is awaited once the sockets
    are subscribed (the servicer sends the response headers there, so a subscriber's call
    returns before the first batch). Raises RelayFailure as the module docstring says."""
    import zmq
    import zmq.asyncio

    ctx = zmq.asyncio.Context.instance()
    normalizer = Normalizer()
    poller = zmq.asyncio.Poller()
    ranks: dict[Any, _Rank] = {}
    try:
        for source in sources:
            socket = ctx.socket(zmq.SUB)
            if hwm is not None:
                socket.setsockopt(zmq.RCVHWM, int(hwm))
            socket.setsockopt(zmq.LINGER, 0)
            socket.subscribe(topic.encode())
            socket.connect(source.endpoint)
            ranks[socket] = _Rank(source)
            poller.register(socket, zmq.POLLIN)
        log.info(
            "KV events: subscribed to %s", ", ".join(r.source.endpoint for r in ranks.values())
        )
        if ready is not None:
            await ready()
        while not stopped():
            # poll before recv: a cancelled zmq.asyncio recv can lose a dequeued message
            for socket, _ in await poller.poll(timeout=int(poll_seconds * 1000)):
                rank = ranks[socket]
                frames = await socket.recv_multipart()
                if len(frames) < 3 or len(frames[1]) != 8:
                    continue
                seq = int.from_bytes(frames[1], "big")
                async for proto in _admit(rank, seq, frames[2], normalizer, ctx, replay_timeout):
                    yield proto
    finally:
        for socket in ranks:
            socket.close(linger=0)
        if normalizer.dropped:
            log.info("KV events not forwarded: %s", normalizer.dropped)


async def _admit(
    rank: _Rank, seq: int, payload: bytes, normalizer: Normalizer, ctx: Any, timeout: float
) -> AsyncIterator[common_pb2.KvEventBatch]:
    """The batches one live message releases: none (a duplicate), the replayed gap before it,
    then itself."""
    number = rank.source.rank
    cursor = rank.cursor
    if cursor is not None:
        if seq == cursor or (rank.replayed and rank.replayed[0] <= seq <= rank.replayed[1]):
            return
        if seq < cursor:
            raise RelayFailure(f"the publisher of rank {number} restarted at {seq} after {cursor}")
        if seq > cursor + 1:
            if rank.source.replay_endpoint is None:
                raise RelayFailure(
                    f"rank {number} skipped from {cursor} to {seq} and has no replay endpoint"
                )
            log.warning(
                "KV events of rank %d skipped from %d to %d; replaying", number, cursor, seq
            )
            async for replayed, data in replay(
                ctx, rank.source.replay_endpoint, cursor + 1, timeout
            ):
                rank.cursor, rank.replayed = replayed, (cursor + 1, replayed)
                yield normalizer.batch(data, replayed, number)
            if rank.cursor < seq - 1:
                raise RelayFailure(f"the replay of rank {number} ended before {seq - 1}")
            if seq <= rank.cursor:
                return  # the replay ran past the live message
    rank.cursor = seq
    if rank.replayed is not None and seq > rank.replayed[1]:
        rank.replayed = None
    yield normalizer.batch(payload, seq, number)
