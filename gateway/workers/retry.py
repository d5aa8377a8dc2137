"""A Generate call that a failing worker does not lose: when a worker fails for its own fault
before sending anything, the same request goes to another worker of the pool, if it has one.

After the first message a retry would repeat tokens the client may already have, so the error
stands then (as a 502 or the worker's own status).

Each attempt gets its own tail from the request's `Tail` (tensors in /dev/shm segments for a
worker sharing it, which the worker unlinks as it reads them), and the attempt's segments are
unlinked when it ends, whatever ended it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import aclosing

import grpc

from gateway.errors import from_grpc
from gateway.observability import tracing
from gateway.workers.tensor_transport import InlineTail, Tail
from gateway.workers.worker import WORKER_FAULTS, Worker
from multimodal.wire import Piece
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
    ) -> None:
        """`tail`: fields already serialized, sent after `generate`'s own (the images), or
        what makes them for each worker tried; `metadata`: gRPC metadata for every attempt
        (mmgate's wire additions, protos/extensions.py), sent with the trace's."""
        self.worker, self.generate, self.reroute = worker, generate, reroute
        self.metadata = tuple(metadata)
        self.tail: Tail = InlineTail(tail) if isinstance(tail, Sequence) else tail

    async def responses(self) -> AsyncIterator[pb.GenerateResponse]:
        """The worker's messages; a call failing before its first message is retried."""
        failed: list[Worker] = []
        while True:
            received, failure = False, None
            call = tracing.start("mmgate.worker.generate", worker_url=self.worker.url)
            attempt = None
            try:
                attempt = await self.tail.attempt(self.worker.facts)
                # aclosing: a consumer that stops (client gone) cancels the call at once
                metadata = (*tracing.metadata(call), *self.metadata)
                responses = self.worker.generate(self.generate, attempt.pieces, metadata)
                async with aclosing(responses) as stream:
                    async for response in stream:
                        received = True
                        yield response
            except grpc.aio.AioRpcError as error:
                failure = error
                self.worker.record_call(error)
                failed.append(self.worker)
                retry = not received and error.code() in WORKER_FAULTS and self.reroute
                if retry and (other := self.reroute(failed)) is not None:
                    self.worker = other
                    continue
                raise from_grpc(error) from None
            finally:
                if attempt is not None:
                    attempt.close()
                tracing.finish(call, failure)
            self.worker.record_call(None)
            return
