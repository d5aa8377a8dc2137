"""A lean gRPC client for server-streaming calls over one HTTP/2 connection (plaintext, h2c).

Why not grpc.aio for this: each message of a grpc.aio stream crosses from gRPC's poller thread
into the event loop through a future, about 80 us of CPU per message here, and the gRPC C core
spends as much again in its own threads (benchmarks/RESULTS.md, "Where our time goes"). A
streamed chat completion is one gRPC message per token, so that cost dominates a Python
gateway. This client parses HTTP/2 frames in the event loop itself (`asyncio.Protocol`), hands
each stream its raw gRPC messages without a thread hop, and batches the flow-control updates.

It implements only what the hot call (`VllmEngine/Generate`) needs, following RFC 9113 and the
gRPC-over-HTTP/2 protocol: one connection per worker, reconnected on demand; request headers
encoded once per method (literal fields, no dynamic table); response headers and trailers
through `hpack`'s decoder; outbound flow control (large pixel payloads wait for the peer's
window); RST_STREAM(CANCEL) when the caller stops reading, which makes the server cancel the
call; PING answered; GOAWAY honoured (streams the server never saw fail as UNAVAILABLE, so the
caller can retry them); SETTINGS_MAX_CONCURRENT_STREAMS respected by waiting for a free slot;
TCP keepalive to notice a peer that vanished. Errors are `grpc.aio.AioRpcError`, as grpc.aio
raises them, so callers handle both clients alike. Unary calls stay on grpc.aio.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import socket
import struct
from collections import deque
from collections.abc import AsyncIterator, Iterator, Sequence
from urllib.parse import unquote

import grpc
from hpack import Decoder

__all__ = ["StreamChannel"]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY = range(8)
WINDOW_UPDATE, CONTINUATION = 8, 9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
SETTINGS_HEADER_TABLE_SIZE, SETTINGS_ENABLE_PUSH, SETTINGS_MAX_CONCURRENT_STREAMS = 1, 2, 3
SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE = 4, 5
ERROR_CANCEL, ERROR_REFUSED_STREAM = 0x8, 0x7
# What we let the server send before it must wait for our WINDOW_UPDATE; returned in batches.
RECEIVE_WINDOW = 16 * 1024 * 1024
WINDOW_REFILL = RECEIVE_WINDOW // 2
MAX_STREAM_ID = 2**31 - 1
REFUSED_RETRIES = 8
# A request message up to this size is joined with its prefix into one buffer before sending.
JOIN_LIMIT = 16 * 1024
# A message: bytes, or pieces (bytes, or 1-D byte views) that follow each other.
Payload = bytes | Sequence[bytes | memoryview]
FRAME_HEADER = struct.Struct(">BHBBI")  # length (24 bit, as 8 + 16), type, flags, stream id
HTTP_TO_GRPC = {
    400: grpc.StatusCode.INTERNAL,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.UNIMPLEMENTED,
    429: grpc.StatusCode.UNAVAILABLE,
    502: grpc.StatusCode.UNAVAILABLE,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.UNAVAILABLE,
}
CODES = {code.value[0]: code for code in grpc.StatusCode}


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    length = len(payload)
    return FRAME_HEADER.pack(length >> 16, length & 0xFFFF, kind, flags, stream_id) + payload


def _hpack_int(value: int, prefix_bits: int, first: int) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out, value = bytearray([first | limit]), value - limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _literal(name: bytes, value: bytes) -> bytes:
    # "Literal Header Field without Indexing -- New Name", strings without Huffman coding: the
    # server's decoder table never changes, so the block can be reused for every request.
    return b"\x00" + _hpack_int(len(name), 7, 0) + name + _hpack_int(len(value), 7, 0) + value


def request_header_block(authority: str, path: str) -> bytes:
    """HPACK block of a gRPC request: POST and http from the static table, the rest literal."""
    fields = [
        (b":path", path.encode()),
        (b":authority", authority.encode()),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
        (b"user-agent", b"mmgate-grpc-stream"),
    ]
    return b"\x83\x86" + b"".join(_literal(name, value) for name, value in fields)


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


class MessageBody:
    """A length-prefixed gRPC message as it goes out: the 5-byte prefix and the message's
    pieces, read through views. Large pieces (pixels) are never joined or copied; small
    messages are joined into one buffer, which is cheaper to write than several."""

    __slots__ = ("pieces", "starts", "size")

    def __init__(self, payload: Payload) -> None:
        pieces = (payload,) if isinstance(payload, bytes) else payload
        length = sum(len(p) for p in pieces)
        prefix = b"\x00" + length.to_bytes(4, "big")
        if length <= JOIN_LIMIT:
            self.pieces = [memoryview(b"".join((prefix, *pieces)))]
        else:
            self.pieces = [memoryview(prefix), *(memoryview(p) for p in pieces if len(p))]
        self.starts = list(itertools.accumulate((len(v) for v in self.pieces), initial=0))
        self.size = self.starts[-1]

    def __len__(self) -> int:
        return self.size

    def views(self, start: int, end: int) -> Iterator[memoryview]:
        """Views of bytes [start, end) of the framed message, piece by piece."""
        index = bisect.bisect_right(self.starts, start) - 1
        while start < end:
            piece, offset = self.pieces[index], start - self.starts[index]
            take = min(len(piece) - offset, end - start)
            yield piece[offset : offset + take]
            start += take
            index += 1


class _Stream:
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


class _Connection(asyncio.Protocol):
    """One HTTP/2 connection; all of its state lives in the event loop's thread."""

    def __init__(self, authority: str) -> None:
        self.authority = authority
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, _Stream] = {}
        self.next_id = 1
        self.closed = False
        self.going_away = False
        self.decoder = Decoder()
        self.buffer = b""
        self.header_block: tuple[int, int, bytearray] | None = None  # stream, flags, fragments
        self.out: list[bytes | memoryview] = []
        self.flush_pending = False
        self.send_window = 65535
        self.peer_initial_window = 65535
        self.peer_max_frame = 16384
        self.peer_max_streams = 2**31
        self.received = 0
        self.window_waiters: list[asyncio.Future] = []
        self.slot_waiters: deque[asyncio.Future] = deque()
        self.blocks: dict[str, bytes] = {}

    # ---- asyncio.Protocol ----

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        _keepalive(transport.get_extra_info("socket"))
        settings = struct.pack(
            ">HIHI", SETTINGS_ENABLE_PUSH, 0, SETTINGS_INITIAL_WINDOW_SIZE, RECEIVE_WINDOW
        )
        grow = struct.pack(">I", RECEIVE_WINDOW - 65535)
        transport.write(
            PREFACE + frame(SETTINGS, 0, 0, settings) + frame(WINDOW_UPDATE, 0, 0, grow)
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        why = f"connection to the worker lost: {exc}" if exc else "worker closed the connection"
        self._fail_all(lambda stream: True, why)

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer + data if self.buffer else data
        pos, end = 0, len(buffer)
        while end - pos >= 9:
            high, low, kind, flags, stream_id = FRAME_HEADER.unpack_from(buffer, pos)
            length = (high << 16) | low
            if end - pos - 9 < length:
                break
            payload = buffer[pos + 9 : pos + 9 + length]
            pos += 9 + length
            self._on_frame(kind, flags, stream_id & MAX_STREAM_ID, payload)
            if self.closed:
                return
        self.buffer = buffer[pos:]
        self._refill_windows()
        self.flush()

    # ---- frames in ----

    def _on_frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self.header_block is not None and kind != CONTINUATION:
            return self._protocol_error("expected CONTINUATION")
        if kind == DATA:
            self._on_data(flags, stream_id, payload)
        elif kind == HEADERS:
            self._on_headers(flags, stream_id, payload)
        elif kind == CONTINUATION:
            self._on_continuation(flags, stream_id, payload)
        elif kind == RST_STREAM:
            self._on_reset(stream_id, payload)
        elif kind == SETTINGS:
            self._on_settings(flags, payload)
        elif kind == PING:
            if not flags & ACK:
                self.out.append(frame(PING, ACK, 0, payload))
        elif kind == GOAWAY:
            self._on_goaway(payload)
        elif kind == WINDOW_UPDATE:
            self._on_window_update(stream_id, payload)
        elif kind == PUSH_PROMISE:
            self._protocol_error("PUSH_PROMISE although push is disabled")

    def _on_data(self, flags: int, stream_id: int, payload: bytes) -> None:
        self.received += len(payload)
        stream = self.streams.get(stream_id)
        if stream is None:
            return
        stream.unacked += len(payload)
        if flags & PADDED:
            payload = payload[1 : len(payload) - payload[0]]
        stream.feed(payload)
        if flags & END_STREAM:
            self._end(stream)
        elif stream.messages:
            stream.wake()

    def _on_headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if flags & PADDED:
            payload = payload[1 : len(payload) - payload[0]]
        if flags & PRIORITY_FLAG:
            payload = payload[5:]
        if flags & END_HEADERS:
            self._on_header_block(flags, stream_id, payload)
        else:
            self.header_block = (stream_id, flags, bytearray(payload))

    def _on_continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        if self.header_block is None or self.header_block[0] != stream_id:
            return self._protocol_error("unexpected CONTINUATION")
        self.header_block[2].extend(payload)
        if flags & END_HEADERS:
            stream_id, first_flags, block = self.header_block
            self.header_block = None
            self._on_header_block(first_flags, stream_id, bytes(block))

    def _on_header_block(self, flags: int, stream_id: int, block: bytes) -> None:
        try:
            headers = self.decoder.decode(block, raw=True)  # always, to keep HPACK state
        except Exception as exc:  # noqa: BLE001 - any HPACK failure breaks the connection
            return self._protocol_error(f"bad header block: {exc}")
        stream = self.streams.get(stream_id)
        if stream is None:
            return
        for name, value in headers:
            if name == b":status":
                stream.http_status = int(value)
            elif name == b"grpc-status":
                stream.status = (int(value), stream.status[1] if stream.status else "")
            elif name == b"grpc-message":
                code = stream.status[0] if stream.status else 0
                stream.status = (code, unquote(value.decode("utf-8", "replace")))
        if flags & END_STREAM:
            self._end(stream)

    def _on_reset(self, stream_id: int, payload: bytes) -> None:
        stream = self.streams.get(stream_id)
        if stream is None:
            return
        code = int.from_bytes(payload[:4], "big")
        stream.refused = code == ERROR_REFUSED_STREAM
        status = (
            grpc.StatusCode.UNAVAILABLE
            if code == ERROR_REFUSED_STREAM
            else grpc.StatusCode.CANCELLED
            if code == ERROR_CANCEL
            else grpc.StatusCode.INTERNAL
        )
        stream.fail(rpc_error(status, f"worker reset the stream (HTTP/2 error {code})"))
        self._forget(stream)

    def _on_settings(self, flags: int, payload: bytes) -> None:
        if flags & ACK:
            return
        for offset in range(0, len(payload) - len(payload) % 6, 6):
            key, value = struct.unpack_from(">HI", payload, offset)
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                delta, self.peer_initial_window = value - self.peer_initial_window, value
                for stream in self.streams.values():
                    stream.send_window += delta
                self._wake_senders()
            elif key == SETTINGS_MAX_FRAME_SIZE:
                self.peer_max_frame = value
            elif key == SETTINGS_MAX_CONCURRENT_STREAMS:
                self.peer_max_streams = value
                self._wake_slot()
        self.out.append(frame(SETTINGS, ACK, 0))

    def _on_goaway(self, payload: bytes) -> None:
        last = int.from_bytes(payload[:4], "big") & MAX_STREAM_ID
        self.going_away = True
        # Streams above `last` were never processed by the server: safe to retry elsewhere.
        self._fail_all(lambda stream: stream.id > last, "worker is going away (GOAWAY)")
        self._close_when_idle()

    def _on_window_update(self, stream_id: int, payload: bytes) -> None:
        increment = int.from_bytes(payload[:4], "big") & MAX_STREAM_ID
        if stream_id == 0:
            self.send_window += increment
        elif (stream := self.streams.get(stream_id)) is not None:
            stream.send_window += increment
        self._wake_senders()

    def _protocol_error(self, why: str) -> None:
        self.out.append(frame(GOAWAY, 0, 0, struct.pack(">II", 0, 1)))  # PROTOCOL_ERROR
        self.flush()
        self._fail_all(lambda stream: True, f"HTTP/2 protocol error from the worker: {why}")
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # ---- streams ----

    def _end(self, stream: _Stream) -> None:
        stream.finish()
        self._forget(stream)

    def _forget(self, stream: _Stream) -> None:
        if self.streams.pop(stream.id, None) is not None:
            self._wake_slot()
            if self.going_away:
                self._close_when_idle()

    def _fail_all(self, which, why: str) -> None:
        for stream in [s for s in self.streams.values() if which(s)]:
            stream.fail(rpc_error(grpc.StatusCode.UNAVAILABLE, why))
            self._forget(stream)
        self._wake_senders()
        if self.closed:
            for waiter in self.slot_waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def _close_when_idle(self) -> None:
        if not self.streams and self.transport is not None:
            self.transport.close()

    def _refill_windows(self) -> None:
        if self.received >= WINDOW_REFILL:
            self.out.append(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self.received)))
            self.received = 0
        for stream in self.streams.values():
            if stream.unacked >= WINDOW_REFILL:
                self.out.append(
                    frame(WINDOW_UPDATE, 0, stream.id, struct.pack(">I", stream.unacked))
                )
                stream.unacked = 0

    def flush(self) -> None:
        if self.out and not self.closed and self.transport is not None:
            self.transport.writelines(self.out)
        self.out.clear()

    def flush_soon(self) -> None:
        """At the end of this turn of the event loop: the calls opened in one turn (under load,
        several) go out in one write, and the worker reads them in one."""
        if not self.flush_pending:
            self.flush_pending = True
            asyncio.get_running_loop().call_soon(self._flush_now)

    def _flush_now(self) -> None:
        self.flush_pending = False
        self.flush()

    @property
    def accepting(self) -> bool:
        return not (self.closed or self.going_away) and self.next_id < MAX_STREAM_ID - 2

    async def wait_for_slot(self) -> None:
        """Until the server's SETTINGS_MAX_CONCURRENT_STREAMS leaves room for one more."""
        while len(self.streams) >= self.peer_max_streams and self.accepting:
            waiter = asyncio.get_running_loop().create_future()
            self.slot_waiters.append(waiter)
            await waiter

    def open(self, path: str, payload: Payload) -> tuple[_Stream, MessageBody, int]:
        """Start a call: headers and as much of the message as the peer's windows allow now.
        Returns the stream, the framed message and how much of it went out."""
        if not self.accepting:
            raise rpc_error(grpc.StatusCode.UNAVAILABLE, "connection to the worker is closing")
        stream = _Stream(self.next_id, self.peer_initial_window)
        self.next_id += 2
        self.streams[stream.id] = stream
        block = self.blocks.get(path) or self.blocks.setdefault(
            path, request_header_block(self.authority, path)
        )
        self.out.append(frame(HEADERS, END_HEADERS, stream.id, block))
        body = MessageBody(payload)
        sent = self._send_data(stream, body)
        self.flush_soon()
        return stream, body, sent

    def _send_data(self, stream: _Stream, body: MessageBody, start: int = 0) -> int:
        pos, end = start, len(body)
        while pos < end and not stream.done:
            size = min(end - pos, self.peer_max_frame, self.send_window, stream.send_window)
            if size <= 0:
                break
            flags = END_STREAM if pos + size == end else 0
            # Header and views of the payload: the pixels are not copied before the socket.
            self.out.append(FRAME_HEADER.pack(size >> 16, size & 0xFFFF, DATA, flags, stream.id))
            self.out.extend(body.views(pos, pos + size))
            self.send_window -= size
            stream.send_window -= size
            pos += size
        return pos

    async def send_rest(self, stream: _Stream, body: MessageBody, sent: int) -> None:
        """The rest of a message larger than the peer's windows, as they open."""
        while sent < len(body) and not stream.done and not self.closed:
            waiter = asyncio.get_running_loop().create_future()
            self.window_waiters.append(waiter)
            await waiter
            sent = self._send_data(stream, body, sent)
            self.flush()

    def _wake_senders(self) -> None:
        waiters, self.window_waiters = self.window_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _wake_slot(self) -> None:
        while self.slot_waiters and len(self.streams) < self.peer_max_streams:
            waiter = self.slot_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def cancel(self, stream: _Stream) -> None:
        """The caller stopped reading: RST_STREAM(CANCEL), the server cancels the call. A no-op
        for a stream that already ended."""
        if self.streams.pop(stream.id, None) is None:
            return
        stream.fail(rpc_error(grpc.StatusCode.CANCELLED, "cancelled by the gateway"))
        self.out.append(frame(RST_STREAM, 0, stream.id, struct.pack(">I", ERROR_CANCEL)))
        self.flush()
        self._wake_slot()
        if self.going_away:
            self._close_when_idle()


def _keepalive(sock: socket.socket | None) -> None:
    # A worker host that vanishes without closing the connection is noticed within ~1 minute.
    if sock is None:
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, option):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


class StreamChannel:
    """Server-streaming gRPC calls to one `host:port`, over a connection opened on demand."""

    def __init__(self, address: str, connect_timeout: float = 10.0) -> None:
        host, _, port = address.rpartition(":")
        self.host, self.port = host.strip("[]"), int(port)
        self.authority = address
        self.connect_timeout = connect_timeout
        self._connection: _Connection | None = None
        self._connecting: asyncio.Future | None = None

    async def stream(self, path: str, payload: Payload) -> AsyncIterator[bytes]:
        """Send one request message (bytes, or pieces sent one after another); yield each
        response message's bytes as it arrives.
        Closing the iterator early cancels the call on the server. A stream the server refused
        (it may still count one that just ended against its concurrency limit) is sent again."""
        for attempt in range(REFUSED_RETRIES + 1):
            connection = await self._connect()
            await connection.wait_for_slot()
            stream, body, sent = connection.open(path, payload)
            try:
                if sent < len(body):
                    await connection.send_rest(stream, body, sent)
                while True:
                    if stream.messages:
                        messages, stream.messages = stream.messages, []
                        for message in messages:
                            yield message
                    elif stream.done:
                        break
                    else:
                        stream.waiter = asyncio.get_running_loop().create_future()
                        await stream.waiter
                        stream.waiter = None
            finally:
                connection.cancel(stream)
            if not stream.refused or attempt == REFUSED_RETRIES:
                break
            await asyncio.sleep(0.001 * 2**attempt)
        if stream.error is not None:
            raise stream.error

    async def _connect(self) -> _Connection:
        connection = self._connection
        if connection is not None and connection.accepting:
            return connection
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._dial())
        try:
            return await asyncio.shield(self._connecting)
        finally:
            if self._connecting is not None and self._connecting.done():
                self._connecting = None

    async def _dial(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(lambda: _Connection(self.authority), self.host, self.port),
                self.connect_timeout,
            )
        except (OSError, asyncio.TimeoutError) as exc:
            raise rpc_error(
                grpc.StatusCode.UNAVAILABLE, f"cannot connect to {self.authority}: {exc}"
            ) from None
        self._connection = connection
        return connection

    async def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None and connection.transport is not None:
            connection.transport.close()
