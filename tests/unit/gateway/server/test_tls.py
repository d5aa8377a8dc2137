"""TLS on the HTTP port: vLLM's flags parsed into settings (and the combinations that cannot
work refused), the SSL context uvicorn builds from them tried with real handshakes in memory
against certificates made here, and the refresher serving a replaced certificate to the next
handshake."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
import uvicorn

from gateway.cli.serve import build_parser
from gateway.cli.serve import main as serve_main
from gateway.server.tls import CertRefresher, HttpTls, from_args, server_config
from tests.support.tls_certs import Pair, TestCa

BASE = ["--model", ".", "--worker", "grpc://127.0.0.1:1"]


@pytest.fixture
def certs(tmp_path: Path) -> tuple[TestCa, Pair, Pair]:
    ca = TestCa(tmp_path)
    return ca, ca.issue("server", server=True), ca.issue("client", server=False)


def _tls(*flags: str) -> HttpTls | None:
    return from_args(build_parser().parse_args([*BASE, *flags]))


def test_no_flag_is_plain_http() -> None:
    assert _tls() is None


def test_flags_become_uvicorn_arguments_as_vllm_passes_them() -> None:
    tls = _tls(
        *("--ssl-keyfile", "k.pem", "--ssl-certfile", "c.pem", "--ssl-ca-certs", "ca.pem"),
        *("--ssl-cert-reqs", "2", "--ssl-ciphers", "ECDHE+AESGCM", "--enable-ssl-refresh"),
    )
    assert tls == HttpTls("k.pem", "c.pem", "ca.pem", 2, "ECDHE+AESGCM", refresh=True)
    assert tls.uvicorn_kwargs() == {
        "ssl_keyfile": "k.pem",
        "ssl_certfile": "c.pem",
        "ssl_ca_certs": "ca.pem",
        "ssl_cert_reqs": 2,
        "ssl_ciphers": "ECDHE+AESGCM",
    }


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--ssl-keyfile", "k.pem"], "given together"),
        (["--ssl-certfile", "c.pem"], "given together"),
        (["--ssl-ca-certs", "ca.pem"], "--ssl-ca-certs need --ssl-certfile"),
        (["--enable-ssl-refresh"], "--enable-ssl-refresh need"),
        (["--ssl-keyfile", "k", "--ssl-certfile", "c", "--ssl-cert-reqs", "2"], "needs --ssl-ca"),
    ],
)
def test_flags_that_cannot_work_together_are_refused(flags: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _tls(*flags)


def test_serve_refuses_them_as_a_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        serve_main([*BASE, "--ssl-keyfile", "k.pem"])
    assert exit_.value.code == 2
    assert "--ssl-keyfile and --ssl-certfile must be given together" in capsys.readouterr().err


def test_cert_reqs_outside_the_ssl_modules_values_is_a_usage_error() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args([*BASE, "--ssl-cert-reqs", "3"])


def _server_context(tls: HttpTls) -> ssl.SSLContext:
    config = server_config(object(), tls, log_config=None)
    config.load()  # (the app is not loaded: uvicorn.Config.load only wraps it)
    assert isinstance(config, uvicorn.Config) and config.ssl is not None
    return config.ssl


def _client_context(ca: TestCa, cert: Pair | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca.path))
    if cert is not None:
        context.load_cert_chain(cert.cert, cert.key)
    return context


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> bytes:
    """A full handshake through memory; the certificate the client was shown. Raises
    ssl.SSLError where either side refuses."""
    s_in, s_out, c_in, c_out = (ssl.MemoryBIO() for _ in range(4))
    server_side = server.wrap_bio(s_in, s_out, server_side=True)
    client_side = client.wrap_bio(c_in, c_out, server_hostname="127.0.0.1")
    pending = {"client", "server"}
    for _ in range(10):
        for name, obj, out, peer in (
            ("client", client_side, c_out, s_in),
            ("server", server_side, s_out, c_in),
        ):
            try:
                obj.do_handshake()
                pending.discard(name)
            except ssl.SSLWantReadError:
                pass
            peer.write(out.read())
        if not pending:
            return client_side.getpeercert(binary_form=True)
    raise AssertionError("handshake did not finish")


def test_a_client_trusting_the_ca_gets_the_servers_certificate(certs) -> None:
    ca, server, _ = certs
    context = _server_context(HttpTls(str(server.key), str(server.cert)))
    assert _handshake(context, _client_context(ca)) == server.der()


def test_a_client_not_trusting_the_ca_refuses_the_server(certs, tmp_path: Path) -> None:
    _, server, _ = certs
    other = TestCa(tmp_path, "other CA")
    context = _server_context(HttpTls(str(server.key), str(server.cert)))
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(context, _client_context(other))


def test_mutual_tls_takes_a_ca_signed_client_and_refuses_one_without_a_certificate(
    certs, tmp_path: Path
) -> None:
    ca, server, client = certs
    tls = HttpTls(str(server.key), str(server.cert), str(ca.path), int(ssl.CERT_REQUIRED))
    context = _server_context(tls)
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert _handshake(context, _client_context(ca, client)) == server.der()
    with pytest.raises(ssl.SSLError, match="CERTIFICATE"):
        _handshake(context, _client_context(ca))
    stranger = TestCa(tmp_path, "other CA").issue("stranger", server=False)
    with pytest.raises(ssl.SSLError):
        _handshake(context, _client_context(ca, stranger))


def test_the_refresher_serves_a_replaced_certificate_to_the_next_handshake(certs) -> None:
    ca, server, _ = certs
    tls = HttpTls(str(server.key), str(server.cert), refresh=True)
    context = _server_context(tls)
    refresher = CertRefresher(context, tls)
    old = server.der()
    assert not refresher.check()  # nothing changed
    ca.issue("server", server=True, into=server)
    assert server.der() != old
    assert refresher.check()
    assert _handshake(context, _client_context(ca)) == server.der()
    assert not refresher.check()  # once per change


def test_files_that_do_not_load_leave_the_previous_certificate_served(certs) -> None:
    ca, server, _ = certs
    tls = HttpTls(str(server.key), str(server.cert), refresh=True)
    context = _server_context(tls)
    refresher = CertRefresher(context, tls)
    old = server.der()
    server.cert.write_text("not a certificate\n")
    assert not refresher.check()
    assert _handshake(context, _client_context(ca)) == old
    ca.issue("server", server=True, into=server)  # the next change loads
    assert refresher.check()
    assert _handshake(context, _client_context(ca)) == server.der()
