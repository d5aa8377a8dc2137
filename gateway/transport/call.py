"""One call's state on a connection: its response messages reassembled from DATA frames, its
flow-control window, and how it ended (the gRPC status, or why it failed)."""

from __future__ import annotations

import asyncio

import grpc

from gateway.transport.frames import CODES, HTTP_TO_GRPC, rpc_error


class CallState:
    """A stream's messages, window and outcome; read by the channel, written by the connection."""

    __slots__ = (
        "id",
        "messages",
        "pending",
        "waiter",
        "error",
        "done",
        "status",
        "http_status",
        "needed",
        "send_window",
        "unacked",
        "refused",
    )

    def __init__(self, stream_id: int, send_window: int) -> None:
        self.id = stream_id
        self.messages: list[bytes] = []
        self.pending = bytearray()  # the start of a gRPC message split over DATA frames
        self.needed = 0  # bytes `pending` must reach before a message can be complete
        self.waiter: asyncio.Future | None = None
        self.error: grpc.aio.AioRpcError | None = None
        self.done = False
        self.status: tuple[int, str] | None = None  # grpc-status, grpc-message
        self.http_status = 0
        self.send_window = send_window
        self.unacked = 0
        self.refused = False  # REFUSED_STREAM: the server did not process it; safe to resend

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def feed(self, data: bytes) -> None:
        """Split DATA payloads into gRPC messages (1 flag byte, 4 length bytes, the message)."""
        if self.pending:
            self.pending += data
            if len(self.pending) < self.needed:
                return  # a large message arriving frame by frame: no copy until complete
            data, self.pending = bytes(self.pending), bytearray()
        pos, end = 0, len(data)
        while end - pos >= 5:
            if data[pos]:
                self.fail(rpc_error(grpc.StatusCode.INTERNAL, "compressed message not negotiated"))
                return
            size = int.from_bytes(data[pos + 1 : pos + 5], "big")
            if end - pos - 5 < size:
                break
            self.messages.append(data[pos + 5 : pos + 5 + size])
            pos += 5 + size
        if pos < end:
            self.pending = bytearray(memoryview(data)[pos:])
            header = self.pending[:5]
            self.needed = 5 + int.from_bytes(header[1:5], "big") if len(header) == 5 else 5

    def fail(self, error: grpc.aio.AioRpcError) -> None:
        if not self.done:
            self.error, self.done = error, True
            self.wake()

    def finish(self) -> None:
        if self.done:
            return
        self.done = True
        self.error = self._outcome()
        self.wake()

    def _outcome(self) -> grpc.aio.AioRpcError | None:
        if self.http_status and self.http_status != 200:
            code = HTTP_TO_GRPC.get(self.http_status, grpc.StatusCode.UNKNOWN)
            return rpc_error(code, f"HTTP status {self.http_status} from the worker")
        if self.status is None:
            return rpc_error(grpc.StatusCode.INTERNAL, "stream ended without a grpc-status")
        code, message = self.status
        if code == 0:
            return (
                None
                if not self.pending
                else rpc_error(grpc.StatusCode.INTERNAL, "stream ended inside a message")
            )
        return rpc_error(CODES.get(code, grpc.StatusCode.UNKNOWN), message)
