"""One HTTP/2 connection to a worker, as an asyncio.Protocol: frames are parsed in the event
loop, each call's messages handed to it without a thread hop; flow control both ways, PING,
GOAWAY, SETTINGS_MAX_CONCURRENT_STREAMS and RST_STREAM(CANCEL) for calls the caller left."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections import deque
from collections.abc import Sequence
from urllib.parse import unquote

import grpc
from hpack import Decoder

from gateway.transport.call import CallState
from gateway.transport.frames import (
    ACK,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    ERROR_CANCEL,
    ERROR_REFUSED_STREAM,
    FRAME_HEADER,
    GOAWAY,
    HEADERS,
    MAX_STREAM_ID,
    PADDED,
    PING,
    PREFACE,
    PRIORITY_FLAG,
    PUSH_PROMISE,
    RECEIVE_WINDOW,
    RST_STREAM,
    SETTINGS,
    SETTINGS_ENABLE_PUSH,
    SETTINGS_INITIAL_WINDOW_SIZE,
    SETTINGS_MAX_CONCURRENT_STREAMS,
    SETTINGS_MAX_FRAME_SIZE,
    WINDOW_REFILL,
    WINDOW_UPDATE,
    MessageBody,
    Payload,
    frame,
    metadata_fields,
    request_header_block,
    rpc_error,
)


class Connection(asyncio.Protocol):
    """One HTTP/2 connection; all of its state lives in the event loop's thread."""

    def __init__(self, authority: str, secure: bool = False) -> None:
        """`secure`: the transport is TLS (`:scheme` https, and the server must pick ALPN
        h2, RFC 9113 3.2)."""
        self.authority = authority
        self.secure = secure
        self.refusal = ""  # why the connection was dropped before its preface, if it was
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, CallState] = {}
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
        if self.secure:
            tls = transport.get_extra_info("ssl_object")
            alpn = tls.selected_alpn_protocol() if tls is not None else None
            if alpn != "h2":
                self.refusal = f"the TLS server did not select ALPN h2 (it chose {alpn!r})"
                self.closed = True
                transport.close()
                return
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

    def _end(self, stream: CallState) -> None:
        stream.finish()
        self._forget(stream)

    def _forget(self, stream: CallState) -> None:
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

    def open(
        self, path: str, payload: Payload, metadata: Sequence[tuple[str, str]] = ()
    ) -> tuple[CallState, MessageBody, int]:
        """Start a call: headers (with `metadata`) and as much of the message as the peer's
        windows allow now. Returns the stream, the framed message and how much of it went
        out."""
        if not self.accepting:
            raise rpc_error(grpc.StatusCode.UNAVAILABLE, "connection to the worker is closing")
        stream = CallState(self.next_id, self.peer_initial_window)
        self.next_id += 2
        self.streams[stream.id] = stream
        block = self.blocks.get(path) or self.blocks.setdefault(
            path, request_header_block(self.authority, path, self.secure)
        )
        if metadata:
            block += metadata_fields(metadata)
        self.out.append(frame(HEADERS, END_HEADERS, stream.id, block))
        body = MessageBody(payload)
        sent = self._send_data(stream, body)
        self.flush_soon()
        return stream, body, sent

    def _send_data(self, stream: CallState, body: MessageBody, start: int = 0) -> int:
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

    async def send_rest(self, stream: CallState, body: MessageBody, sent: int) -> None:
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

    def cancel(self, stream: CallState) -> None:
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
