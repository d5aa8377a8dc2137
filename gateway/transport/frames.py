"""HTTP/2 and gRPC framing for our stream client: frame types and flags, the request header
block (HPACK literals, no dynamic table), gRPC status codes, and outgoing messages as views.

RFC 9113 and gRPC-over-HTTP/2; only what `VllmEngine/Generate` needs.
"""

from __future__ import annotations

import bisect
import itertools
import struct
from collections.abc import Iterator, Sequence

import grpc

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


def metadata_fields(metadata: Sequence[tuple[str, str]]) -> bytes:
    """Custom metadata (e.g. a trace's `traceparent`) as literal fields to append to a
    request's header block."""
    return b"".join(_literal(name.encode(), value.encode()) for name, value in metadata)


def request_header_block(authority: str, path: str, secure: bool = False) -> bytes:
    """HPACK block of a gRPC request: POST and the scheme (https over TLS, else http) from the
    static table, the rest literal."""
    fields = [
        (b":path", path.encode()),
        (b":authority", authority.encode()),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
        (b"user-agent", b"mmgate-grpc-stream"),
    ]
    scheme = b"\x87" if secure else b"\x86"  # static table 7 :scheme https, 6 http
    return b"\x83" + scheme + b"".join(_literal(name, value) for name, value in fields)


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
