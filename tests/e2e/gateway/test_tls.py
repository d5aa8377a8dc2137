"""`mmgate serve` over https with vLLM's flags, mutual TLS and certificate refresh, with one
process and with `--api-server-count 2` (each child builds its own context and refresher).

Certificates are made here (tests/support/tls_certs.py): a CA, a server certificate for
127.0.0.1 and localhost, a client certificate. The gateway requires a client certificate
(`--ssl-ca-certs CA --ssl-cert-reqs 2`) and reloads its own on change
(`--enable-ssl-refresh`). In front of benchmarks/mock_worker.py: what is tested is the HTTP
port, not generation."""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from tests.support.gateway_process import GatewayProcess
from tests.support.mock_worker import MockWorker
from tests.support.tls_certs import Pair, TestCa


@dataclass
class Tls:
    ca: TestCa
    server: Pair
    client: Pair

    def context(self, client_cert: bool = True) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca.path))
        if client_cert:
            context.load_cert_chain(self.client.cert, self.client.key)
        return context


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Tls:
    ca = TestCa(tmp_path_factory.mktemp("tls"))
    return Tls(ca, ca.issue("server", server=True), ca.issue("client", server=False))


@pytest.fixture(scope="module")
def mock(text_model, tmp_path_factory) -> Iterator[MockWorker]:
    worker = MockWorker(text_model, tmp_path_factory.mktemp("tls-mock") / "mock.log")
    yield worker
    worker.stop()


@pytest.fixture(scope="module", params=["1", "2"], ids=["one-process", "two-processes"])
def gateway(request, text_model, mock, certs, tmp_path_factory) -> Iterator[GatewayProcess]:
    log = tmp_path_factory.mktemp("gw-tls") / "gateway.log"
    flags = [
        *("--ssl-keyfile", str(certs.server.key), "--ssl-certfile", str(certs.server.cert)),
        *("--ssl-ca-certs", str(certs.ca.path), "--ssl-cert-reqs", "2"),
        *("--enable-ssl-refresh", "--api-server-count", request.param),
    ]
    worker = mock.url.removeprefix("grpc://")
    proc = GatewayProcess(text_model, [worker], log, *flags, tls=certs.context())
    yield proc.wait_ready()
    proc.stop()


def test_the_openai_sdk_with_the_ca_and_a_client_certificate_chats_over_https(gateway):
    client = gateway.client()
    model = client.models.list().data[0].id
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hello"}], max_tokens=4
    )
    assert reply.choices[0].message.content
    assert reply.usage.completion_tokens > 0


def test_plain_http_to_the_tls_port_gets_no_page(gateway):
    url = gateway.base_url.replace("https://", "http://")
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/ready", timeout=5)


def test_a_client_without_a_certificate_is_refused(gateway, certs):
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{gateway.base_url}/ready", verify=certs.context(client_cert=False), timeout=5)


def test_a_client_not_trusting_the_ca_refuses_the_gateway(gateway, certs):
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{gateway.base_url}/ready", timeout=5)  # (the system's CAs)


def test_the_playground_is_served_over_https_with_its_policy(gateway):
    page = httpx.get(f"{gateway.base_url}/playground", verify=gateway.tls, timeout=10)
    assert page.status_code == 200
    assert "connect-src 'self'" in page.headers["content-security-policy"]
    # nothing the page loads is named by an absolute http:// URL (mixed content)
    assert "http://" not in page.text


def _served_certificate(gateway: GatewayProcess, certs: Tls) -> bytes:
    """The certificate a new connection is shown."""
    raw = socket.create_connection(("127.0.0.1", gateway.port), timeout=5)
    with certs.context().wrap_socket(raw, server_hostname="127.0.0.1") as conn:
        return conn.getpeercert(binary_form=True)


def test_a_replaced_certificate_is_served_to_new_connections_without_a_restart(gateway, certs):
    old = certs.server.der()
    assert _served_certificate(gateway, certs) == old
    certs.ca.issue("server", server=True, into=certs.server)
    new = certs.server.der()
    assert new != old
    # Every process reloads: several new connections in a row (the kernel spreads them over
    # the processes) all get the new certificate.
    deadline, streak = time.monotonic() + 15, 0
    while streak < 8:
        assert time.monotonic() < deadline, "the new certificate was not served"
        streak = streak + 1 if _served_certificate(gateway, certs) == new else 0
        time.sleep(0.05 if streak else 0.3)
    pid = gateway.proc.pid
    assert gateway.proc.poll() is None and gateway.proc.pid == pid  # no restart
    test_the_openai_sdk_with_the_ca_and_a_client_certificate_chats_over_https(gateway)
