"""Fixtures shared by the gateway's unit tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gateway.server.config import GatewayConfig

KEY_ENV = ("VLLM_API_KEY", "MMGATE_API_KEYS", "MMGATE_ADMIN_API_KEYS", "MMGATE_TENANT_API_KEYS")


@pytest.fixture
def served(monkeypatch) -> Callable[..., GatewayConfig]:
    """Runs `mmgate serve`'s main on argv (after a model and a worker) without serving:
    returns the config the app was built with. The keys' environment starts empty."""
    from gateway.cli import serve
    from gateway.observability import request_log
    from gateway.server import app as app_module
    from gateway.server import tls

    built: list[GatewayConfig] = []
    for name in KEY_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(app_module, "create_app", lambda config: built.append(config))
    # serve.main runs tls.Server (uvicorn's Server): never bind the port (it would serve on)
    monkeypatch.setattr(tls.Server, "run", lambda self: setattr(self, "started", True))
    monkeypatch.setattr(request_log, "configure_logging", lambda *a, **k: None)

    def run(*argv: str) -> GatewayConfig:
        base = ["--model", ".", "--worker", "grpc://127.0.0.1:9"]
        assert serve.main([*base, *argv]) == 0
        return built[-1]

    return run
