"""The worker hop over TLS (issue 31, item 2): `mmgate engine` serving mutual TLS, reached by
`mmgate serve` through grpcs:// with certificates made now. (SMG 1.13 cannot: see the last test.)

One engine for the module, started requiring a client certificate: the gateways with the CA and
the client certificate chat through it (both stream clients, one and two processes); those
without the client certificate, with a foreign one, without the CA, or dialling grpc:// cannot
use it. A grpcs:// worker is never spoken to in plain text, whatever its handshake does.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import openai
import pytest

from tests.support.engines import WorkerProcess, direct_chat, free_port
from tests.support.gateway_process import GatewayProcess, read_chat_stream
from tests.support.smg import smg_binary
from tests.support.tls_certs import TestCa

pytestmark = pytest.mark.slow
MESSAGES = [{"role": "user", "content": "Write a haiku about the sea."}]
MAX_TOKENS = 12


class Certs:
    def __init__(self, root: Path) -> None:
        self.ca = TestCa(root)
        self.engine = self.ca.issue("engine", server=True)
        self.gateway = self.ca.issue("gateway", server=False)
        self.other_ca = TestCa(root, "other CA")
        self.stranger = self.other_ca.issue("stranger", server=False)

    def client_flags(self) -> list[str]:
        return [
            "--ca-cert-paths", str(self.ca.path),
            "--client-cert-path", str(self.gateway.cert),
            "--client-key-path", str(self.gateway.key),
        ]  # fmt: skip


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Certs:
    return Certs(tmp_path_factory.mktemp("worker-certs"))


@pytest.fixture(scope="module")
def engine(text_model, certs, tmp_path_factory) -> Iterator[WorkerProcess]:
    credentials = grpc.ssl_channel_credentials(
        certs.ca.path.read_bytes(), certs.gateway.key.read_bytes(), certs.gateway.cert.read_bytes()
    )
    worker = WorkerProcess(
        text_model,
        tmp_path_factory.mktemp("logs") / "tls-engine.log",
        credentials=credentials,
        tls_cert_path=certs.engine.cert,
        tls_key_path=certs.engine.key,
        tls_ca_cert_path=certs.ca.path,
    )
    try:
        yield worker.wait_ready()
    finally:
        worker.stop()


@pytest.fixture(scope="module")
def expected(engine, text_model) -> str:
    """What the engine generates for the chat-templated prompt, asked directly (over mTLS)."""
    return direct_chat(engine.stub(), text_model, MESSAGES, MAX_TOKENS)[2]


def test_the_engine_says_it_serves_mutual_tls(engine) -> None:
    assert "TLS, client certificate required" in engine.log_tail(200)


def _chat(gateway: GatewayProcess, stream: bool) -> str:
    client = gateway.client()
    model = client.models.list().data[0].id
    ask = {"model": model, "messages": MESSAGES, "temperature": 0, "max_tokens": MAX_TOKENS}
    if stream:
        text, finish, _, _ = read_chat_stream(client.chat.completions.create(**ask, stream=True))
    else:
        reply = client.chat.completions.create(**ask)
        text, finish = reply.choices[0].message.content, reply.choices[0].finish_reason
    assert finish == "length"
    return text


@pytest.fixture(
    scope="module",
    params=[("mmgate", "1"), ("grpcio", "1"), ("mmgate", "2")],
    ids=["mmgate-client", "grpcio-client", "two-processes"],
)
def gateway(request, engine, certs, text_model, tmp_path_factory) -> Iterator[GatewayProcess]:
    """A gateway with the CA and the client certificate; Generate streamed by our HTTP/2
    client or grpc.aio; one process, or two (the settings cross the spawn pipe)."""
    client, count = request.param
    log = tmp_path_factory.mktemp("gw-tls") / "gateway.log"
    flags = [*certs.client_flags(), "--stream-client", client, "--api-server-count", count]
    proc = GatewayProcess(text_model, [f"grpcs://{engine.address}"], log, *flags)
    try:
        yield proc.wait_ready()
    finally:
        proc.stop()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_chat_over_mutual_tls(gateway, expected, stream) -> None:
    assert _chat(gateway, stream) == expected


def test_the_posture_line_names_the_mutual_tls_hop(gateway) -> None:
    log = gateway.log_path.read_text()
    assert "workers hop TLS, client certificate sent (mutual TLS)" in log


def test_a_grpcs_worker_added_through_admin_is_reached_over_tls(gateway, engine) -> None:
    """POST /admin/workers with grpcs:// (the same engine under its other certificate name,
    localhost): connected with the gateway's CA and client certificate."""
    url = f"grpcs://localhost:{engine.port}"
    added = httpx.post(f"{gateway.base_url}/admin/workers", json={"url": url}, timeout=30)
    try:
        assert added.status_code == 201, added.text
        described = added.json()
        assert described["url"] == url
        assert described["connected"] and not described["refused"]
    finally:
        httpx.request("DELETE", f"{gateway.base_url}/admin/workers", json={"url": url})


def _unusable(
    model: Path, worker: str, log: Path, *flags: str, wait_for: str = "not reachable"
) -> str:
    """Starts a gateway whose only worker it cannot use; returns its log once it said so,
    after checking it is not ready and a chat gets a 503."""
    proc = GatewayProcess(model, [worker], log, *flags)
    try:
        deadline = time.monotonic() + 60
        while wait_for not in log.read_text():
            assert proc.proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        assert httpx.get(f"{proc.base_url}/ready", timeout=5).status_code != 200
        with pytest.raises(openai.APIStatusError) as refused:
            proc.client().chat.completions.create(model="m", messages=MESSAGES, max_tokens=2)
        assert refused.value.status_code == 503
        return log.read_text()
    finally:
        proc.stop()


@pytest.mark.parametrize(
    ("case", "why"),
    [
        ("no client certificate", ""),
        ("a foreign client certificate", ""),
        ("no CA: the system's", "CERTIFICATE_VERIFY_FAILED"),
        ("another CA", "CERTIFICATE_VERIFY_FAILED"),
    ],
)
def test_a_gateway_without_the_right_credentials_cannot_use_the_worker(
    engine, certs, text_model, tmp_path, case, why
) -> None:
    flags = {
        "no client certificate": ["--ca-cert-paths", str(certs.ca.path)],
        "a foreign client certificate": [
            "--ca-cert-paths", str(certs.ca.path),
            "--client-cert-path", str(certs.stranger.cert),
            "--client-key-path", str(certs.stranger.key),
        ],
        "no CA: the system's": [],
        "another CA": ["--ca-cert-paths", str(certs.other_ca.path)],
    }[case]  # fmt: skip
    log = _unusable(text_model, f"grpcs://{engine.address}", tmp_path / "gw.log", *flags)
    line = next(x for x in log.splitlines() if "not reachable" in x)
    assert f"grpcs://{engine.address}" in line and "no plain-text fallback" in line
    assert why in line


def test_grpc_to_the_tls_port_cannot_use_the_worker(engine, certs, text_model, tmp_path) -> None:
    log = _unusable(
        text_model, f"grpc://{engine.address}", tmp_path / "gw.log", *certs.client_flags()
    )
    assert "workers hop plain text" in log


class FirstBytes:
    """A TCP listener that records the first bytes of each connection and closes it: what a
    client says before any reply. A TLS client opens with a handshake record (0x16), an h2c
    one with the HTTP/2 preface ("PRI * HTTP/2.0")."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.seen: list[bytes] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                with contextlib.suppress(OSError):
                    self.seen.append(conn.recv(16))


def test_a_grpcs_worker_is_never_spoken_to_in_plain_text(certs, text_model, tmp_path) -> None:
    listener = FirstBytes()
    try:
        _unusable(
            text_model, f"grpcs://127.0.0.1:{listener.port}", tmp_path / "gw.log",
            *certs.client_flags(),
        )  # fmt: skip
    finally:
        listener.sock.close()
    assert listener.seen, "the gateway never dialled the worker"
    assert all(first[:1] == b"\x16" for first in listener.seen if first), listener.seen
    assert not any(first.startswith(b"PRI") for first in listener.seen)


# ---- SMG 1.13 and TLS to a gRPC worker


def test_smg_1_13_sends_no_tls_handshake_to_a_grpcs_worker(certs, tmp_path) -> None:
    """Why no test has SMG drive our engine over TLS: SMG 1.13.0, given a grpcs:// worker and
    its own --ca-cert-paths/--client-cert-path/--client-key-path, opens its gRPC connections
    and closes them without a byte (no ClientHello), and its HTTP probe sends a plain-text
    `GET /v1/models` to the port. Its TLS flags serve HTTP(S) workers only. When this fails,
    SMG speaks TLS to gRPC workers: add the SMG-over-TLS chat test."""
    listener = FirstBytes()
    cmd = [
        smg_binary(), "launch", "--host", "127.0.0.1", "--port", str(free_port()),
        "--worker-urls", f"grpcs://127.0.0.1:{listener.port}", "--policy", "round_robin",
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
        *certs.client_flags(),
    ]  # fmt: skip
    with open(tmp_path / "smg.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=log, env={**os.environ, "NO_COLOR": "1"})
    try:
        deadline = time.monotonic() + 20
        while len(listener.seen) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(20)
        listener.sock.close()
    assert len(listener.seen) >= 2, (tmp_path / "smg.log").read_text()[-3000:]
    assert not any(first[:1] == b"\x16" for first in listener.seen), listener.seen
    assert any(first.startswith(b"GET /v1/models") for first in listener.seen), listener.seen
