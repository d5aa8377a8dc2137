"""Our HTTP/2 stream client over TLS (grpcs:// workers): real handshakes with a grpc.aio server
holding certificates made now, mutual TLS, ALPN h2, and no plain-text fallback."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import grpc
import pytest
from hpack import Decoder

from gateway.transport import StreamChannel
from gateway.transport.frames import request_header_block
from gateway.workers.tls import WorkerTls
from tests.support.tls_certs import Pair, TestCa
from tests.unit.gateway.transport.test_grpc_stream import PATH, Streamer, request


class Certs:
    def __init__(self, root: Path) -> None:
        self.ca = TestCa(root)
        self.server = self.ca.issue("worker", server=True)
        self.client = self.ca.issue("gateway", server=False)
        self.other = TestCa(root, "other CA")
        self.stranger = self.other.issue("stranger", server=False)


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Certs:
    return Certs(tmp_path_factory.mktemp("certs"))


async def start_tls_server(certs: Certs, mutual: bool) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler(
        "test.Streamer", {"Stream": grpc.unary_stream_rpc_method_handler(Streamer().stream)}
    )
    server.add_generic_rpc_handlers((handler,))
    pair = (certs.server.key.read_bytes(), certs.server.cert.read_bytes())
    credentials = grpc.ssl_server_credentials(
        [pair],
        root_certificates=certs.ca.path.read_bytes() if mutual else None,
        require_client_auth=mutual,
    )
    port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    return server, f"127.0.0.1:{port}"


def channel(address: str, settings: WorkerTls, name: str = "127.0.0.1") -> StreamChannel:
    return StreamChannel(address, connect_timeout=5, tls=(settings.ssl_context(), name))


async def collect(ch: StreamChannel) -> list[bytes]:
    try:
        return [m async for m in ch.stream(PATH, request(count=3, size=5))]
    finally:
        await ch.close()


def against(certs: Certs, mutual: bool, ask) -> None:
    async def main():
        server, address = await start_tls_server(certs, mutual)
        try:
            await ask(address)
        finally:
            await server.stop(None)

    asyncio.run(main())


def expect_unavailable(ch: StreamChannel, *words: str):
    async def check():
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await collect(ch)
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        for word in words:
            assert word in failed.value.details()

    return check()


EXPECTED = [bytes([i]) * 5 for i in range(3)]


def test_a_tls_server_is_streamed_from_with_the_ca(certs) -> None:
    async def ask(address):
        assert await collect(channel(address, WorkerTls((certs.ca.path,)))) == EXPECTED

    against(certs, mutual=False, ask=ask)


def test_mutual_tls_takes_the_client_certificate(certs) -> None:
    settings = WorkerTls((certs.ca.path,), certs.client.cert, certs.client.key)

    async def ask(address):
        assert await collect(channel(address, settings)) == EXPECTED

    against(certs, mutual=True, ask=ask)


@pytest.mark.parametrize("client", [None, "stranger"])
def test_mutual_tls_refuses_no_certificate_or_a_foreign_one(certs, client) -> None:
    pair: Pair | None = certs.stranger if client else None
    settings = WorkerTls((certs.ca.path,), pair and pair.cert, pair and pair.key)

    async def ask(address):
        await expect_unavailable(channel(address, settings))

    against(certs, mutual=True, ask=ask)


def test_a_server_not_signed_by_the_given_ca_is_refused(certs) -> None:
    async def ask(address):
        ch = channel(address, WorkerTls((certs.other.path,)))
        await expect_unavailable(ch, "TLS handshake", "CERTIFICATE_VERIFY_FAILED")

    against(certs, mutual=False, ask=ask)


def test_without_a_ca_the_system_cas_do_not_trust_a_private_ca(certs) -> None:
    async def ask(address):
        await expect_unavailable(channel(address, WorkerTls()), "CERTIFICATE_VERIFY_FAILED")

    against(certs, mutual=False, ask=ask)


def test_a_name_the_certificate_does_not_carry_is_refused(certs) -> None:
    async def ask(address):
        ch = channel(address, WorkerTls((certs.ca.path,)), name="engine.example")
        await expect_unavailable(ch, "CERTIFICATE_VERIFY_FAILED")

    against(certs, mutual=False, ask=ask)


def test_plain_text_to_a_tls_port_gets_no_messages(certs) -> None:
    async def ask(address):
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await collect(StreamChannel(address, connect_timeout=5))
        assert failed.value.code() in {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL}

    against(certs, mutual=False, ask=ask)


def test_tls_to_a_plain_port_fails_and_never_falls_back(certs) -> None:
    async def main():
        from tests.unit.gateway.transport.test_grpc_stream import start_server

        streamer = Streamer()
        server, address = await start_server(streamer)
        try:
            await expect_unavailable(channel(address, WorkerTls((certs.ca.path,))), "TLS")
            assert streamer.received == []  # no call reached it in plain text
        finally:
            await server.stop(None)

    asyncio.run(main())


def test_a_tls_server_that_does_not_pick_h2_is_refused_before_any_frame(certs) -> None:
    """An HTTPS server speaking only http/1.1: the handshake succeeds, ALPN is not h2, and the
    client closes without writing the HTTP/2 preface."""
    received = bytearray()

    async def main():
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(certs.server.cert), str(certs.server.key))
        context.set_alpn_protocols(["http/1.1"])

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
            received.extend(await reader.read())
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=context)
        port = server.sockets[0].getsockname()[1]
        try:
            ch = channel(f"127.0.0.1:{port}", WorkerTls((certs.ca.path,)))
            await asyncio.wait_for(expect_unavailable(ch, "ALPN h2"), 10)
            await asyncio.sleep(0.1)
        finally:
            server.close()
            await server.wait_closed()

    asyncio.run(main())
    assert bytes(received) == b""


@pytest.mark.parametrize(("secure", "scheme"), [(True, b"https"), (False, b"http")])
def test_the_scheme_pseudo_header_follows_the_transport(secure, scheme) -> None:
    fields = dict(Decoder().decode(request_header_block("w:1", PATH, secure), raw=True))
    assert fields[b":scheme"] == scheme
    assert fields[b":method"] == b"POST"


def test_grpcio_channel_credentials_do_mutual_tls_with_the_same_settings(certs) -> None:
    """The grpc.aio side of a grpcs:// worker (unary calls) takes the same settings."""

    async def call(address: str, settings: WorkerTls) -> list[bytes]:
        async with grpc.aio.secure_channel(address, settings.grpc_credentials()) as ch:
            return [m async for m in ch.unary_stream(PATH)(request(count=3, size=5))]

    async def ask(address):
        good = WorkerTls((certs.ca.path,), certs.client.cert, certs.client.key)
        assert await call(address, good) == EXPECTED
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await call(address, WorkerTls((certs.ca.path,)))
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE

    against(certs, mutual=True, ask=ask)
