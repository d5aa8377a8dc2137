"""`mmgate engine --tls-cert-path --tls-key-path [--tls-ca-cert-path]`: the refusals, and the
server credentials in real handshakes (TLS; mutual TLS refusing a client without a certificate
or with one from another CA)."""

from __future__ import annotations

import argparse
import asyncio
import ssl

import grpc
import pytest

from engine_server.tls import ServerTls, from_args
from tests.support.tls_certs import TestCa

PATH = "/test.Echo/Echo"


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    root = tmp_path_factory.mktemp("certs")
    ca, other = TestCa(root), TestCa(root, "other CA")
    return {
        "ca": ca,
        "server": ca.issue("engine", server=True),
        "client": ca.issue("gateway", server=False),
        "stranger": other.issue("stranger", server=False),
    }


def _args(cert=None, key=None, ca=None) -> argparse.Namespace:
    return argparse.Namespace(tls_cert_path=cert, tls_key_path=key, tls_ca_cert_path=ca)


def test_no_flag_is_plain_text() -> None:
    assert from_args(_args()) is None


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"cert"}, "--tls-cert-path needs --tls-key-path"),
        ({"key"}, "--tls-key-path needs --tls-cert-path"),
        ({"ca"}, "--tls-ca-cert-path needs --tls-cert-path and --tls-key-path"),
        ({"key", "ca"}, "--tls-key-path needs --tls-cert-path"),
    ],
)
def test_incomplete_flags_are_refused(certs, given, message) -> None:
    paths = {"cert": certs["server"].cert, "key": certs["server"].key, "ca": certs["ca"].path}
    with pytest.raises(ValueError, match=message):
        from_args(_args(**{k: v for k, v in paths.items() if k in given}))


def test_a_missing_file_or_a_mismatched_key_is_refused(certs, tmp_path) -> None:
    server = certs["server"]
    with pytest.raises(ValueError, match=f"cannot read {tmp_path / 'x.pem'}"):
        from_args(_args(server.cert, server.key, tmp_path / "x.pem"))
    with pytest.raises(ValueError, match="cannot load the TLS files"):
        from_args(_args(server.cert, certs["stranger"].key))


async def _echo(request: bytes, context) -> bytes:
    return request


async def _echo_server(settings: ServerTls) -> tuple[grpc.aio.Server, int]:
    """A started gRPC server on the engine's TLS credentials, echoing test.Echo/Echo."""
    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler(
        "test.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(_echo)}
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_secure_port("127.0.0.1:0", settings.credentials())
    await server.start()
    return server, port


async def _call(settings: ServerTls, certs, client: str | None) -> bytes:
    server, port = await _echo_server(settings)
    pair = certs[client] if client else None
    credentials = grpc.ssl_channel_credentials(
        certs["ca"].path.read_bytes(),
        pair.key.read_bytes() if pair else None,
        pair.cert.read_bytes() if pair else None,
    )
    try:
        async with grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials) as channel:
            return await channel.unary_unary(PATH)(b"hi", timeout=10)
    finally:
        await server.stop(None)


def test_tls_serves_a_client_trusting_the_ca(certs) -> None:
    settings = from_args(_args(certs["server"].cert, certs["server"].key))
    assert asyncio.run(_call(settings, certs, None)) == b"hi"


@pytest.mark.parametrize(
    ("client", "admitted"), [("client", True), (None, False), ("stranger", False)]
)
def test_mutual_tls_requires_a_client_certificate_from_the_ca(certs, client, admitted) -> None:
    settings = from_args(_args(certs["server"].cert, certs["server"].key, certs["ca"].path))
    if admitted:
        assert asyncio.run(_call(settings, certs, client)) == b"hi"
        return
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        asyncio.run(_call(settings, certs, client))
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


async def _served_certificates(settings: ServerTls, certs, steps) -> list[bytes]:
    """The certificate a new connection is shown after each step (a callable changing the
    files), and an echo call over gRPC after the last."""
    server, port = await _echo_server(settings)
    context = ssl.create_default_context(cafile=str(certs["ca"].path))
    context.set_alpn_protocols(["h2"])
    shown = []
    try:
        for step in steps:
            step()
            _, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=context, server_hostname="localhost"
            )
            shown.append(writer.get_extra_info("ssl_object").getpeercert(binary_form=True))
            writer.close()
        credentials = grpc.ssl_channel_credentials(certs["ca"].path.read_bytes())
        async with grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials) as channel:
            assert await channel.unary_unary(PATH)(b"hi", timeout=10) == b"hi"
    finally:
        await server.stop(None)
    return shown


def test_a_renewed_certificate_is_served_to_new_connections_without_a_restart(tmp_path) -> None:
    ca = TestCa(tmp_path)
    pair = ca.issue("engine", server=True)
    settings = from_args(_args(pair.cert, pair.key))
    first = pair.der()
    renewed: list[bytes] = []

    def renew() -> None:
        ca.issue("engine", server=True, into=pair)
        renewed.append(pair.der())

    def break_it() -> None:  # a Secret half written: the last good certificate stays
        pair.cert.write_text("-----BEGIN CERTIFICATE-----\nnot one\n")

    shown = asyncio.run(_served_certificates(settings, {"ca": ca}, [lambda: None, renew, break_it]))
    assert renewed[0] != first
    assert shown == [first, renewed[0], renewed[0]]
