"""`--api-server-count` children get every key and surface setting, and no key shows in their
command line (what `ps` shows) or environment: the config reaches them through the spawn pipe."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from gateway.api.responses.sqlite_store import SqliteResponseStore
from gateway.server.config import GatewayConfig
from gateway.server.processes.shared import ProcessTable, make_context
from gateway.server.processes.supervisor import RESPONSE_STORE, Supervisor, bind

API, ADMIN = "sk-child-api-5d1e", "sk-child-admin-77b0"


@pytest.mark.slow  # spawns a gateway process (~2 s)
def test_a_child_gets_the_keys_by_pipe_and_not_argv(tmp_path, monkeypatch):
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    config = GatewayConfig(
        model=tmp_path,
        workers=["grpc://127.0.0.1:9"],
        api_keys=[API],
        admin_api_keys=[ADMIN],
        metrics_auth="admin",
    )
    sup = Supervisor(1, config, "127.0.0.1", 0, "text")
    sup.sock = bind("127.0.0.1", 0)
    sup.ctx = make_context()
    sup.table = ProcessTable(sup.ctx, 1)
    sup.metrics_dir, sup.store_path = tmp_path, tmp_path / RESPONSE_STORE
    SqliteResponseStore.create(sup.store_path)
    url = f"http://127.0.0.1:{sup.sock.getsockname()[1]}"
    sup._start(0)
    child = sup.children[0]
    try:
        proc = Path(f"/proc/{child.process.pid}")
        seen = (proc / "cmdline").read_bytes() + (proc / "environ").read_bytes()
        assert API.encode() not in seen and ADMIN.encode() not in seen
        assert b"--api-key" not in seen
        with httpx.Client(base_url=url, timeout=5) as client:
            deadline = time.monotonic() + 60
            while True:
                try:
                    health = client.get("/health")
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline, "the child never served"
                    time.sleep(0.2)
            assert health.status_code == 200
            # the child serves with the supervisor's settings
            assert client.get("/v1/models").status_code == 401
            assert client.get("/admin/workers", headers=_bearer(API)).status_code == 401
            assert client.get("/admin/workers", headers=_bearer(ADMIN)).status_code == 200
            assert client.get("/metrics", headers=_bearer(API)).status_code == 401
            assert client.get("/metrics", headers=_bearer(ADMIN)).status_code == 200
    finally:
        child.process.terminate()
        child.process.join(10)
        child.outbox.put(None)
        sup.sock.close()


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}
