"""`mmgate serve`'s flags for TLS to the workers (SMG's names): parsing, refusals, the posture
line, and the settings reaching a worker's channels and the --api-server-count children."""

from __future__ import annotations

import asyncio
import pickle
from pathlib import Path

import pytest

from gateway.cli.serve import build_parser, main
from gateway.server.access import Surfaces, posture
from gateway.workers import tls
from gateway.workers.pool import PoolOptions, WorkerPool
from gateway.workers.tls import WorkerTls
from gateway.workers.worker import Worker
from tests.support.tls_certs import TestCa


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    root = tmp_path_factory.mktemp("certs")
    ca, other = TestCa(root), TestCa(root, "other CA")
    return ca, other, ca.issue("gateway", server=False), other.issue("stranger", server=False)


def _settings(*flags: str) -> WorkerTls:
    return tls.from_args(build_parser().parse_args(["--model", "m", "--worker", "w:1", *flags]))


def test_no_flag_is_system_cas_and_no_client_certificate() -> None:
    assert _settings() == WorkerTls()
    assert not WorkerTls().mutual


def test_flags_are_parsed_several_cas_and_a_client_pair(certs) -> None:
    ca, other, client, _ = certs
    settings = _settings(
        "--ca-cert-paths", str(ca.path), str(other.path),
        "--client-cert-path", str(client.cert), "--client-key-path", str(client.key),
    )  # fmt: skip
    assert settings.ca_cert_paths == (ca.path, other.path)
    assert (settings.client_cert_path, settings.client_key_path) == (client.cert, client.key)
    assert settings.mutual
    # picklable: the config crosses the spawn pipe to the --api-server-count children
    assert pickle.loads(pickle.dumps(PoolOptions(tls=settings))).tls == settings


@pytest.mark.parametrize(
    ("which", "message"),
    [
        ("cert", "--client-cert-path needs --client-key-path"),
        ("key", "--client-key-path needs --client-cert-path"),
    ],
)
def test_half_a_client_pair_is_refused(certs, which, message) -> None:
    client = certs[2]
    flag, path = (
        ("--client-cert-path", client.cert)
        if which == "cert"
        else ("--client-key-path", client.key)
    )
    with pytest.raises(ValueError, match=message):
        _settings(flag, str(path))


def test_a_key_not_matching_the_certificate_is_refused(certs) -> None:
    _, _, client, stranger = certs
    with pytest.raises(ValueError, match="cannot load the worker TLS files"):
        _settings("--client-cert-path", str(client.cert), "--client-key-path", str(stranger.key))


def test_a_missing_ca_file_is_refused_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope.pem"
    with pytest.raises(ValueError, match=f"cannot read {missing}"):
        _settings("--ca-cert-paths", str(missing))


def test_serve_refuses_them_as_a_usage_error(certs, capsys) -> None:
    client = certs[2]
    with pytest.raises(SystemExit) as exited:
        main(["--model", "m", "--worker", "grpcs://w:1", "--client-key-path", str(client.key)])
    assert exited.value.code == 2
    assert "--client-key-path needs --client-cert-path" in capsys.readouterr().err


def _hop(workers: list[str], settings: WorkerTls | None) -> str:
    surfaces = Surfaces.of([], [], "open", True)
    line, _ = posture("127.0.0.1", 8000, surfaces, False, True, workers, worker_tls=settings)
    return line.split("workers hop ")[1]


def test_posture_names_tls_and_a_client_certificate(certs) -> None:
    ca, _, client, _ = certs
    mutual = WorkerTls((ca.path,), client.cert, client.key)
    assert _hop(["grpcs://a:1", "grpcs://b:1"], WorkerTls()) == "TLS"
    assert _hop(["grpcs://a:1"], mutual) == "TLS, client certificate sent (mutual TLS)"
    assert _hop(["grpcs://a:1", "grpc://b:1"], mutual) == "plain text"
    assert _hop(["grpc://a:1"], mutual) == "plain text"


def test_grpcs_workers_get_secure_channels_grpc_ones_plain(certs) -> None:
    asyncio.run(_channels(certs[0]))


async def _channels(ca: TestCa) -> None:
    secure = Worker("grpcs://127.0.0.1:1", tls=WorkerTls((ca.path,)))
    plain = Worker("grpc://127.0.0.1:1", tls=WorkerTls((ca.path,)))
    try:
        assert secure.tls and secure._streams.tls is not None
        assert secure._streams.tls[1] == "127.0.0.1"
        assert not plain.tls and plain._streams.tls is None
    finally:
        await secure.close()
        await plain.close()


def test_dns_members_of_a_grpcs_name_stay_tls_checked_against_the_name(certs) -> None:
    asyncio.run(_dns_members(certs[0]))


async def _dns_members(ca: TestCa) -> None:
    async def resolve(host: str, port: int) -> list[str]:
        return ["10.0.0.1", "fd00::1"]

    pool = WorkerPool(
        [], PoolOptions(tls=WorkerTls((ca.path,))), ["grpcs://engines.ns.svc.cluster.local.:50051"],
        resolver=resolve,
    )  # fmt: skip
    try:
        await pool._resolve_dns()
        assert sorted(pool.workers) == ["grpcs://10.0.0.1:50051", "grpcs://[fd00::1]:50051"]
        for worker in pool.workers.values():
            assert worker.tls and worker._streams.tls[1] == "engines.ns.svc.cluster.local"
    finally:
        await pool.close()
