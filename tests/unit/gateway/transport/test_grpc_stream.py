"""gateway.transport, our HTTP/2 client for streamed calls, against a real grpc.aio server.

The server is grpcio's own (the C core speaks HTTP/2 for it), with a raw-bytes service whose
behaviour each request chooses: how many messages of what size, an error status, a wait. The
end-to-end tests of the gateway (tests/e2e/gateway) run the same client against our engine
worker and smg-grpc-servicer; these pin the protocol edges one by one and compare with
grpc.aio where both can be asked the same thing.
"""

from __future__ import annotations

import asyncio
import json
import socket

import grpc
import numpy as np
import pytest

from gateway.transport import MessageBody, StreamChannel

PATH = "/test.Streamer/Stream"


class Streamer:
    """Request: JSON {"count", "size", "code", "message", "sleep", "pad"}; replies `count`
    messages of `size` bytes (message i filled with byte i % 251), then the status asked for."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.received: list[int] = []
        self.bodies: list[bytes] = []

    async def stream(self, request: bytes, context: grpc.aio.ServicerContext):
        ask = json.loads(request[: request.index(b"}") + 1])
        self.received.append(len(request))
        self.bodies.append(request)
        try:
            for i in range(ask.get("count", 0)):
                yield bytes([i % 251]) * ask.get("size", 1)
                if ask.get("sleep"):
                    await asyncio.sleep(ask["sleep"])
        except asyncio.CancelledError:  # how grpc.aio tells a handler its call was cancelled
            self.cancelled.set()
            raise
        if ask.get("code"):
            await context.abort(grpc.StatusCode[ask["code"]], ask.get("message", ""))


def request(**ask) -> bytes:
    pad = ask.pop("pad", 0)
    return json.dumps(ask).encode() + b" " * pad


async def start_server(streamer: Streamer, options=()) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", -1), *options])
    handler = grpc.method_handlers_generic_handler(
        "test.Streamer", {"Stream": grpc.unary_stream_rpc_method_handler(streamer.stream)}
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


async def collect(channel: StreamChannel, payload: bytes) -> list[bytes]:
    return [m async for m in channel.stream(PATH, payload)]


async def collect_grpcio(address: str, payload: bytes) -> list[bytes]:
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.unary_stream(PATH)(payload)
        return [m async for m in call]


def run(coro):
    return asyncio.run(coro)


def with_server(check, streamer: Streamer, options=()) -> None:
    """Run `await check(channel, address)` against a fresh server; close both after."""

    async def main():
        server, address = await start_server(streamer, options)
        channel = StreamChannel(address)
        try:
            await check(channel, address)
        finally:
            await channel.close()
            await server.stop(None)

    run(main())


def test_messages_equal_grpcio_including_ones_split_over_frames():
    async def check(channel: StreamChannel, address: str) -> None:
        for ask in ({"count": 17, "size": 40}, {"count": 3, "size": 100_000}, {"count": 0}):
            ours = await collect(channel, request(**ask))
            assert ours == await collect_grpcio(address, request(**ask))
            assert [len(m) for m in ours] == [ask.get("size", 1)] * ask["count"]

    with_server(check, Streamer())


def test_more_than_the_receive_window_flows_as_windows_are_refilled():
    async def check(channel: StreamChannel, address: str) -> None:
        # 48 MiB on one stream, three times the 16 MiB window we grant.
        messages = await collect(channel, request(count=48, size=1 << 20))
        assert len(messages) == 48
        assert all(m == bytes([i % 251]) * (1 << 20) for i, m in enumerate(messages))

    with_server(check, Streamer())


def test_a_large_request_waits_for_the_servers_window():
    streamer = Streamer()

    async def check(channel: StreamChannel, address: str) -> None:
        # Far beyond the 64 KiB an HTTP/2 peer grants before its first WINDOW_UPDATE.
        payload = request(count=1, pad=12_000_000)
        assert len(await collect(channel, payload)) == 1
        assert streamer.received == [len(payload)]

    with_server(check, streamer)


def test_a_request_in_pieces_arrives_as_their_concatenation():
    streamer = Streamer()
    big = np.random.default_rng(0).integers(0, 256, 3_000_001, dtype=np.uint8)
    # beyond the first windows, pieces crossing frame borders, empty ones, array views
    large = [request(count=1), b"", memoryview(big)[5:], b"x" * 16385, memoryview(b"yz")]
    small = [request(count=2), b"ab", memoryview(b"cd")]  # joined before sending

    async def check(channel: StreamChannel, address: str) -> None:
        assert len(await collect(channel, large)) == 1
        assert len(await collect(channel, small)) == 2

    with_server(check, streamer)
    assert streamer.bodies == [b"".join(large), b"".join(small)]


def test_message_body_views_cover_any_range():
    pieces = [b"abc", memoryview(b"defgh"), b"", b"i" * 20_000]
    body = MessageBody(pieces)
    whole = b"\x00" + (20_008).to_bytes(4, "big") + b"abcdefgh" + b"i" * 20_000
    assert len(body) == len(whole)
    for start, end in [(0, 5), (3, 9), (7, 13), (12, len(whole)), (0, len(whole)), (6, 6)]:
        assert b"".join(body.views(start, end)) == whole[start:end]


@pytest.mark.parametrize(
    "code, message",
    [
        ("INVALID_ARGUMENT", "prompt too long: 5000 > 4096 (100% sure, ünïcode)"),
        ("RESOURCE_EXHAUSTED", ""),
        ("UNAVAILABLE", "engine is shutting down"),
    ],
)
def test_error_status_and_details_are_grpcios(code, message):
    async def check(channel: StreamChannel, address: str) -> None:
        for count in (0, 2):  # trailers-only response, and trailers after messages
            payload = request(count=count, code=code, message=message)
            got = []
            with pytest.raises(grpc.aio.AioRpcError) as ours:
                async for m in channel.stream(PATH, payload):
                    got.append(m)
            assert len(got) == count
            with pytest.raises(grpc.aio.AioRpcError) as theirs:
                await collect_grpcio(address, payload)
            assert ours.value.code() == theirs.value.code() == grpc.StatusCode[code]
            assert ours.value.details() == theirs.value.details() == message

    with_server(check, Streamer())


def test_closing_the_iterator_cancels_the_call_on_the_server():
    streamer = Streamer()

    async def check(channel: StreamChannel, address: str) -> None:
        stream = channel.stream(PATH, request(count=1000, sleep=0.01))
        assert await anext(stream) == b"\x00"
        await stream.aclose()
        await asyncio.wait_for(streamer.cancelled.wait(), 5)
        # The connection stays usable for the next call.
        assert len(await collect(channel, request(count=2))) == 2

    with_server(check, streamer)


def test_a_caller_cancelled_while_its_request_is_still_sending_leaves_nothing_open():
    streamer = Streamer()

    async def check(channel: StreamChannel, address: str) -> None:
        payload = request(count=1, pad=200_000_000)  # takes a while at window pace
        reader = asyncio.create_task(collect(channel, payload))
        await asyncio.sleep(0.05)
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader
        assert channel._connection.streams == {}  # reset and forgotten, not half sent
        assert len(await collect(channel, request(count=2))) == 2
        assert streamer.received == [len(request(count=2))]

    with_server(check, streamer)


def test_many_concurrent_streams_under_a_max_concurrent_streams_setting():
    async def check(channel: StreamChannel, address: str) -> None:
        await collect(channel, request(count=1))  # learn the server's SETTINGS
        results = await asyncio.gather(
            *(collect(channel, request(count=5, size=10, sleep=0.005)) for _ in range(12))
        )
        assert all(len(r) == 5 for r in results)

    with_server(check, Streamer(), options=[("grpc.max_concurrent_streams", 2)])


def test_server_gone_mid_stream_is_unavailable_and_a_new_server_is_reached():
    async def main():
        server, address = await start_server(Streamer())
        channel = StreamChannel(address)
        got = []
        with pytest.raises(grpc.aio.AioRpcError) as error:
            async for m in channel.stream(PATH, request(count=1000, sleep=0.01)):
                got.append(m)
                if len(got) == 3:
                    await server.stop(None)
        assert error.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
        assert 3 <= len(got) < 1000
        port = int(address.rsplit(":", 1)[1])
        server = grpc.aio.server()
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "test.Streamer",
                    {"Stream": grpc.unary_stream_rpc_method_handler(Streamer().stream)},
                ),
            )
        )
        server.add_insecure_port(address)
        await server.start()
        try:
            assert len(await collect(channel, request(count=2))) == 2, port
        finally:
            await channel.close()
            await server.stop(None)

    run(main())


def test_graceful_server_stop_lets_open_streams_finish():
    async def main():
        server, address = await start_server(Streamer())
        channel = StreamChannel(address)
        try:
            stream = channel.stream(PATH, request(count=20, sleep=0.02))
            first = await anext(stream)
            stopping = asyncio.create_task(server.stop(5))  # GOAWAY, then wait for calls
            rest = [m async for m in stream]
            assert [first, *rest] == [bytes([i]) for i in range(20)]
            await stopping
        finally:
            await channel.close()

    run(main())


def test_nobody_listening_is_unavailable():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there

    async def main():
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await collect(StreamChannel(f"127.0.0.1:{port}"), request(count=1))
        assert error.value.code() == grpc.StatusCode.UNAVAILABLE

    run(main())
