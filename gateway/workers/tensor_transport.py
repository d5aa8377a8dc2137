"""How a request's tensors reach a worker: inline in the gRPC message, or, when the worker
shares this host's /dev/shm, in segments there that the message names (TensorData.shm).

A minute of video is tens to hundreds of MB of tensors; through shared memory they are written
once and read once instead of going through the socket (serialized, framed, copied by both
gRPC ends). A worker reads a segment and unlinks it, so every attempt at a worker (a retry
after a worker failed, on another worker or the same) gets segments of its own, and the
gateway unlinks whatever an attempt wrote once the attempt ends, however it ends: the worker
read them (they are gone already), failed or died before reading, or the client left.

For a worker that keeps items by hash (gateway/workers/send_once.py) an attempt leaves out
the tensors of the items the worker holds, and says so in its call metadata.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from gateway.observability.metrics import GatewayMetrics
from gateway.workers.send_once import ItemMirror, Plan, item_sizes, plan_nodes
from gateway.workers.worker import WorkerFacts
from multimodal.pipeline import Prepared
from multimodal.shm import SHM_DIR, shm_namespace_id, unlink_segment, write_segment
from multimodal.wire import Node, Piece, flatten, payload_sizes
from protos import common_pb2
from protos.extensions import item_cache_call_metadata

log = logging.getLogger("mmgate.gateway")
TensorTransportMode = Literal["auto", "inline", "shm"]
TRANSPORT_MODES: tuple[TensorTransportMode, ...] = ("auto", "inline", "shm")
# Below this a segment costs more (create, write, open, read, unlink: syscalls on both ends)
# than copying the bytes through the socket; a video's pixel tensor is far above it.
DEFAULT_SHM_MIN_BYTES = 1 << 20


class _Cancelled(Exception):
    """The attempt was abandoned while its segments were being written."""


@dataclass
class Attempt:
    """The tail of one Generate call at one worker, and the segments written for it."""

    pieces: Sequence[Piece]
    segments: list[str] = field(default_factory=list)
    shm_dir: str = SHM_DIR
    abandoned: bool = False
    # What the call tells the worker's item cache (send-once), and as gRPC metadata.
    plan: Plan | None = None
    metadata: tuple[tuple[str, str], ...] = ()

    def close(self) -> None:
        """Unlink every segment this attempt wrote that the worker has not (idempotent)."""
        while self.segments:
            unlink_segment(self.segments.pop(), self.shm_dir)


class Tail(Protocol):
    """The serialized fields sent after a GenerateRequest's own, per attempt."""

    async def attempt(
        self, facts: WorkerFacts | None, items: ItemMirror | None = None, omit: bool = True
    ) -> Attempt:
        """`items`: the worker's item-cache mirror (None: it keeps none); `omit` False: send
        every item in full (a resend after the mirror proved wrong)."""
        ...


@dataclass(frozen=True)
class InlineTail:
    """Fields sent as they are to every worker (text, or media the worker preprocesses)."""

    pieces: Sequence[Piece] = ()

    async def attempt(
        self, facts: WorkerFacts | None, items: ItemMirror | None = None, omit: bool = True
    ) -> Attempt:
        return Attempt(self.pieces)


class TensorTransport:
    """The gateway-wide choice (`--multimodal-tensor-transport`), applied per worker."""

    def __init__(
        self,
        mode: TensorTransportMode = "auto",
        min_bytes: int = DEFAULT_SHM_MIN_BYTES,
        metrics: GatewayMetrics | None = None,
        shm_dir: str = SHM_DIR,
        namespace: str | None = None,
    ) -> None:
        """`namespace`: this host's /dev/shm identity (computed when None; tests pass one)."""
        if mode not in TRANSPORT_MODES:
            raise ValueError(f"tensor transport must be one of {TRANSPORT_MODES}, got {mode!r}")
        self.mode, self.min_bytes, self.metrics, self.shm_dir = mode, min_bytes, metrics, shm_dir
        self.namespace = shm_namespace_id(shm_dir) if namespace is None else namespace
        self.owner = f"mmgate:{os.getpid()}"

    def uses_shm(self, facts: WorkerFacts | None) -> bool:
        """Whether payloads for this worker go through /dev/shm: always with `shm` (the
        operator says the worker shares it), with `auto` only when the worker advertises the
        same /dev/shm as ours."""
        if self.mode == "inline" or facts is None:
            return False
        if self.mode == "shm":
            return True
        return bool(self.namespace) and facts.shm_namespace_id == self.namespace

    def tail(self, nodes: Sequence[Node], inline: Sequence[Piece]) -> Tail:
        """`inline`: `flatten(nodes)`, already made (the message size was checked on it)."""
        if self.mode == "inline" or not any(n >= self.min_bytes for n in payload_sizes(nodes)):
            return InlineTail(inline)
        return ShmTail(self, nodes, inline)


@dataclass(frozen=True)
class ShmTail:
    transport: TensorTransport
    nodes: Sequence[Node]
    inline: Sequence[Piece]

    async def attempt(
        self, facts: WorkerFacts | None, items: ItemMirror | None = None, omit: bool = True
    ) -> Attempt:
        if not self.transport.uses_shm(facts):
            return Attempt(self.inline)
        attempt = Attempt((), shm_dir=self.transport.shm_dir)
        # Writing a clip's tensors takes milliseconds to tens of them: off the event loop.
        job = asyncio.ensure_future(asyncio.to_thread(self._write, attempt))
        try:
            attempt.pieces = await asyncio.shield(job)
        except asyncio.CancelledError:
            # The thread cannot be stopped mid-write: it stops at the next segment, and what
            # it wrote is unlinked once it is done.
            attempt.abandoned = True
            job.add_done_callback(lambda done: _close_after(done, attempt))
            raise
        except BaseException:
            attempt.close()
            raise
        return attempt

    def _write(self, attempt: Attempt) -> list[Piece]:
        transport = self.transport

        def place(data: bytes | memoryview) -> common_pb2.ShmHandle | None:
            size = len(data)
            if size < transport.min_bytes:
                return None
            if attempt.abandoned:
                raise _Cancelled
            try:
                name = write_segment(data, transport.shm_dir)
            except OSError as error:  # a full or missing /dev/shm: this tensor goes inline
                log.warning("could not write a /dev/shm segment (%s): sending it inline", error)
                if transport.metrics is not None:
                    transport.metrics.shm_write_failures.inc()
                return None
            attempt.segments.append(name)
            if transport.metrics is not None:
                transport.metrics.shm_bytes.inc(size)
            return common_pb2.ShmHandle(name=name, offset=0, nbytes=size, owner_id=transport.owner)

        try:
            return flatten(self.nodes, place)
        except _Cancelled:
            return []


@dataclass
class SendOnceTail:
    """A preprocessed request's items, sent to a worker with an item cache as its mirror
    says: the items it holds left out, the others in full (`base`: the tail sending them all,
    for a worker without one)."""

    prepared: Prepared
    base: Tail
    transport: TensorTransport | None = None
    _sizes: list[list[int]] | None = None

    async def attempt(
        self, facts: WorkerFacts | None, items: ItemMirror | None = None, omit: bool = True
    ) -> Attempt:
        if items is None:
            return await self.base.attempt(facts)
        if self._sizes is None:
            self._sizes = item_sizes(self.prepared)
        pairs = [
            (key, size)
            for part, sizes in zip(self.prepared.parts, self._sizes)
            for key, size in zip(part.hashes, sizes)
        ]
        plan = items.plan(pairs, omit)
        if plan.empty:
            return await self.base.attempt(facts)
        try:
            if plan.cached:
                nodes = plan_nodes(self.prepared, plan.cached)
                tail = (
                    self.transport.tail(nodes, flatten(nodes))
                    if self.transport is not None
                    else InlineTail(flatten(nodes))
                )
                attempt = await tail.attempt(facts)
            else:
                attempt = await self.base.attempt(facts)
        except BaseException:
            plan.fail()
            raise
        attempt.plan, attempt.metadata = plan, item_cache_call_metadata(plan.call)
        return attempt


def _close_after(job: asyncio.Future, attempt: Attempt) -> None:
    if not job.cancelled():
        job.exception()  # (retrieved: nobody awaits it any more)
    attempt.close()
