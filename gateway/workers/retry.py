"""A Generate call that a failing worker does not lose: when a worker fails for its own fault
before sending anything, the same request goes to another worker of the pool, if it has one.

After the first message a retry would repeat tokens the client may already have, so the error
stands then (as a 502 or the worker's own status).

Each attempt gets its own tail from the request's `Tail` (tensors in /dev/shm segments for a
worker sharing it, which the worker unlinks as it reads them), and the attempt's segments are
unlinked when it ends, whatever ended it.

With a worker that keeps items by hash, an attempt may leave out items its mirror says the
worker holds (gateway/workers/send_once.py). If the worker lacks some (it restarted, or its
cache was flushed) it refuses the request before doing anything (FAILED_PRECONDITION naming
them): the mirror forgets them (everything, when the worker dropped this gateway's whole
partition) and the same worker gets the request again with every item in full, once. The
client sees nothing of it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import aclosing

import grpc

from gateway.errors import from_grpc
from gateway.observability import tracing
from gateway.observability.metrics import GatewayMetrics
from gateway.workers.tensor_transport import Attempt, InlineTail, Tail
from gateway.workers.worker import WORKER_FAULTS, Worker
from multimodal.wire import Piece
from protos import extensions
from protos import vllm_engine_pb2 as pb

# Given the workers that failed this request so far, another one to try (None: no other).
Reroute = Callable[[list[Worker]], Worker | None]


class RetryingGenerate:
    """One GenerateRequest and the worker currently serving it."""

    def __init__(
        self,
        worker: Worker,
        generate: pb.GenerateRequest,
        tail: Tail | Sequence[Piece] = (),
        reroute: Reroute | None = None,
        metadata: Sequence[tuple[str, str]] = (),
        metrics: GatewayMetrics | None = None,
    ) -> None:
        """`tail`: fields already serialized, sent after `generate`'s own (the images), or
        what makes them for each worker tried; `metadata`: gRPC metadata for every attempt
        (mmgate's wire additions, protos/extensions.py), sent with the trace's."""
        self.worker, self.generate, self.reroute = worker, generate, reroute
        self.metadata = tuple(metadata)
        self.metrics = metrics
        self.tail: Tail = InlineTail(tail) if isinstance(tail, Sequence) else tail

    async def responses(self) -> AsyncIterator[pb.GenerateResponse]:
        """The worker's messages; a call failing before its first message is retried."""
        failed: list[Worker] = []
        resent = False  # after a cache miss: every item in full
        while True:
            received, failure = False, None
            call = tracing.start("mmgate.worker.generate", worker_url=self.worker.url)
            attempt = None
            try:
                items = getattr(self.worker, "mm_items", None)  # (None: it keeps none)
                attempt = await self.tail.attempt(self.worker.facts, items, omit=not resent)
                # aclosing: a consumer that stops (client gone) cancels the call at once
                metadata = (*tracing.metadata(call), *self.metadata, *attempt.metadata)
                responses = self.worker.generate(self.generate, attempt.pieces, metadata)
                async with aclosing(responses) as stream:
                    async for response in stream:
                        if not received:
                            self._applied(attempt)
                        received = True
                        yield response
            except grpc.aio.AioRpcError as error:
                failure = error
                self.worker.record_call(error)
                if not received and not resent and self._missed(error, attempt):
                    resent = True
                    if self.metrics is not None:
                        self.metrics.send_once_resends.inc()
                    continue
                failed.append(self.worker)
                retry = not received and error.code() in WORKER_FAULTS and self.reroute
                if retry and (other := self.reroute(failed)) is not None:
                    self.worker = other
                    continue
                raise from_grpc(error) from None
            finally:
                if attempt is not None:
                    if attempt.plan is not None:
                        attempt.plan.fail()  # (nothing once applied)
                    attempt.close()
                tracing.finish(call, failure)
            self.worker.record_call(None)
            return

    def _applied(self, attempt: Attempt) -> None:
        """The worker's first message: it built the prompt, so it applied the cache plan."""
        plan = attempt.plan
        if plan is None:
            return
        plan.confirm()
        if self.metrics is not None and plan.cached:
            self.metrics.send_once_hits.inc(plan.saved_items)
            self.metrics.send_once_bytes_saved.inc(plan.saved_bytes)

    def _missed(self, error: grpc.aio.AioRpcError, attempt: Attempt | None) -> bool:
        """Whether the worker refused the attempt for items it does not hold; the mirror
        then forgets them (all of them, for another life of the worker's cache or a partition
        it dropped)."""
        plan = attempt.plan if attempt is not None else None
        if plan is None or error.code() != grpc.StatusCode.FAILED_PRECONDITION:
            return False
        miss = extensions.cache_miss(error.details())
        if miss is None:
            return False
        mirror = plan.mirror
        if self.worker.mm_items is mirror:
            if miss.instance == mirror.instance and not miss.gone:
                mirror.missed(miss.missing)
            elif miss.instance:
                self.worker.mm_items = mirror.renewed(miss.instance)
            else:  # the worker keeps no items any more
                self.worker.mm_items = None
        return True
