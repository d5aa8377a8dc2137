"""A lean gRPC client for server-streaming calls over one HTTP/2 connection (h2c, or TLS with
ALPN h2 for grpcs:// workers).

Why not grpc.aio for this: each message of a grpc.aio stream crosses from gRPC's poller thread
into the event loop through a future, about 80 us of CPU per message here, and the gRPC C core
spends as much again in its own threads (benchmarks/RESULTS.md, "Our gRPC stream client vs
grpc.aio"). A
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

Modules: `frames` (framing, header block, messages as views), `call` (one call's state),
`connection` (the HTTP/2 protocol), `channel` (`StreamChannel`, what callers use).
"""

from gateway.transport.channel import StreamChannel
from gateway.transport.frames import MessageBody

__all__ = ["MessageBody", "StreamChannel"]
