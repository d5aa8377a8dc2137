"""Credentials by surface (issue 31, item 3) and the posture line (item 5): keys from flags,
files and the environment; /v1, /admin and /metrics each asking for their own; /admin off on
a non-loopback bind without an admin key; keys compared in constant time and never shown."""

from __future__ import annotations

import hmac
import logging

import pytest
from starlette.responses import PlainTextResponse
from starlette.testclient import TestClient

from gateway.ratelimit.policy import Limit, Policy, RateLimits
from gateway.server import middleware
from gateway.server.access import (
    Surfaces,
    admin_enabled,
    is_loopback,
    posture,
    read_keys,
    split_keys,
)
from gateway.server.config import GatewayConfig
from gateway.server.middleware import ApiKeyMiddleware
from gateway.server.tls import HttpTls

API, ADMIN = "sk-api-7f3a", "sk-admin-91c2"


def test_split_keys_takes_lines_and_commas_and_skips_comments():
    text = "# the app's keys\nk1\n\n  k2 , k3\n  # old: k4\n"
    assert split_keys(text) == ["k1", "k2", "k3"]


def test_read_keys_from_flags_files_and_env_in_order_without_repeats(tmp_path, monkeypatch):
    (tmp_path / "a").write_text("f1\nf2\n")
    (tmp_path / "b").write_text("f2\r\nf3\n")
    monkeypatch.setenv("KEYS_A", "e1,f1")
    monkeypatch.delenv("KEYS_B", raising=False)
    keys = read_keys(["g1", " ", ""], [tmp_path / "a", tmp_path / "b"], ["KEYS_A", "KEYS_B"])
    assert keys == ["g1", "f1", "f2", "f3", "e1"]


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
        ("gateway.example", False),
        ("", False),
    ],
)
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


@pytest.mark.parametrize(
    ("host", "admin_keys", "insecure", "enabled"),
    [
        ("127.0.0.1", [], False, True),
        ("0.0.0.0", [], False, False),
        ("0.0.0.0", [ADMIN], False, True),
        ("0.0.0.0", [], True, True),
    ],
)
def test_admin_is_off_only_off_loopback_without_an_admin_key(host, admin_keys, insecure, enabled):
    assert admin_enabled(host, admin_keys, insecure) is enabled


def _client(**kw) -> TestClient:
    surfaces = Surfaces.of(
        kw.get("api", []), kw.get("admin", []), kw.get("metrics", "open"), kw.get("on", True)
    )
    return TestClient(ApiKeyMiddleware(PlainTextResponse("ok"), kw.get("api", []), surfaces))


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


# (middleware settings, path, key sent or None, status)
SURFACE_CASES = [
    # only --api-key, as before: /v1 and /admin take it, /metrics and /health are open
    ({"api": [API]}, "/v1/models", None, 401),
    ({"api": [API]}, "/v1/models", API, 200),
    ({"api": [API]}, "/admin/workers", None, 401),
    ({"api": [API]}, "/admin/workers", API, 200),
    ({"api": [API]}, "/metrics", None, 200),
    ({"api": [API]}, "/health", None, 200),
    # an admin key: /admin takes it and not the API key; /v1 does not take the admin key
    ({"api": [API], "admin": [ADMIN]}, "/admin/workers", API, 401),
    ({"api": [API], "admin": [ADMIN]}, "/admin/workers", ADMIN, 200),
    ({"api": [API], "admin": [ADMIN]}, "/v1/models", ADMIN, 401),
    ({"api": [API], "admin": [ADMIN]}, "/v1/models", API, 200),
    # an admin key alone leaves /v1 open
    ({"admin": [ADMIN]}, "/v1/models", None, 200),
    ({"admin": [ADMIN]}, "/admin/workers", None, 401),
    # /admin off: 404 with any key or none
    ({"api": [API], "on": False}, "/admin/workers", API, 404),
    ({"on": False}, "/admin/workers", None, 404),
    ({"on": False}, "/v1/models", None, 200),
    # /metrics keyed
    ({"api": [API], "metrics": "api-key"}, "/metrics", None, 401),
    ({"api": [API], "metrics": "api-key"}, "/metrics", API, 200),
    ({"api": [API], "admin": [ADMIN], "metrics": "admin"}, "/metrics", API, 401),
    ({"api": [API], "admin": [ADMIN], "metrics": "admin"}, "/metrics", ADMIN, 200),
    ({"api": [API], "admin": [ADMIN], "metrics": "admin"}, "/health", None, 200),
]


@pytest.mark.parametrize(("settings", "path", "key", "status"), SURFACE_CASES)
def test_each_surface_asks_for_its_own_key(settings, path, key, status):
    answer = _client(**settings).get(path, headers=_bearer(key) if key else {})
    assert answer.status_code == status
    if key:
        assert key not in answer.text  # never echoed
    if status == 404:
        assert answer.json() == {"detail": "Not Found"}  # as a path that does not exist


def test_admin_off_answers_as_a_path_that_does_not_exist():
    from gateway.server.app import create_app

    config = GatewayConfig(model=".", workers=["grpc://127.0.0.1:9"], admin_enabled=False)
    client = TestClient(create_app(config))
    absent = client.get("/no-such-path")
    for path in ("/admin/workers", "/admin"):
        off = client.get(path)
        assert (off.status_code, off.json()) == (absent.status_code, absent.json())
        assert off.status_code == 404
    assert client.get("/health").status_code == 200
    documented = client.get("/openapi.json").json()["paths"]
    assert "/v1/chat/completions" in documented
    assert not [path for path in documented if path.startswith("/admin")]
    on = TestClient(create_app(GatewayConfig(model=".", workers=["grpc://127.0.0.1:9"])))
    assert "/admin/workers" in on.get("/openapi.json").json()["paths"]


def test_several_api_keys_each_pass_in_either_header():
    client = _client(api=["k1", "k2", API])
    for key in ("k1", "k2", API):
        assert client.get("/v1/models", headers=_bearer(key)).status_code == 200
        assert client.get("/v1/models", headers={"x-api-key": key}).status_code == 200
    assert client.get("/v1/models", headers=_bearer("k3")).status_code == 401


def test_every_key_is_compared_in_constant_time_against_every_key(monkeypatch):
    """hmac.compare_digest, on equal-length digests (the raw keys' lengths differ), for every
    key given against every key: no early exit once one matches."""
    seen: list[tuple[int, int]] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        seen.append((len(a), len(b)))
        return real(a, b)

    client = _client(api=["k1", "a-much-longer-key", API])
    monkeypatch.setattr(middleware.hmac, "compare_digest", counting)
    headers = {**_bearer("k1"), "x-api-key": "nope"}
    assert client.get("/v1/models", headers=headers).status_code == 200
    assert seen == [(32, 32)] * 6


def test_no_key_in_a_repr():
    config = GatewayConfig(model=".", workers=[], api_keys=[API], admin_api_keys=[ADMIN])
    for text in (repr(config), str(config), repr(config.surfaces())):
        assert API not in text and ADMIN not in text


# ---- the posture line


def _posture(host: str, workers=("grpc://e:9000",), playground=True, **kw) -> tuple[str, bool]:
    admin_keys = kw.get("admin", [])
    surfaces = Surfaces.of(
        kw.get("api", []),
        admin_keys,
        kw.get("metrics", "open"),
        admin_enabled(host, admin_keys, kw.get("insecure", False)),
    )
    return posture(host, 8000, surfaces, bool(admin_keys), playground, list(workers))


def test_posture_on_loopback_with_no_flags_is_informational_and_names_every_surface():
    line, warn = _posture("127.0.0.1")
    assert not warn
    for part in (
        "http plain text",
        "/v1 OPEN",
        "/admin OPEN",
        "/metrics OPEN",
        "playground OPEN",
        "workers hop plain text",
    ):
        assert part in line, line


def test_posture_off_loopback_warns_naming_what_is_open():
    line, warn = _posture("0.0.0.0", api=[API])
    assert warn
    assert "/v1 api key required (1 accepted)" in line
    assert "/admin off (404" in line
    assert line.endswith(
        "open or plain text on a non-loopback address: http, /metrics, playground, workers hop"
    )
    assert API not in line


def test_posture_with_every_surface_keyed():
    line, warn = _posture(
        "0.0.0.0", api=[API, "k2"], admin=[ADMIN], metrics="admin", playground=False
    )
    assert "/v1 api key required (2 accepted)" in line
    assert "/admin admin key required (1 accepted)" in line
    assert "/metrics admin key required (1 accepted)" in line
    assert "playground off" in line
    # still plain text on both hops: no TLS yet (issue 31, items 1 and 2)
    assert warn and line.endswith("non-loopback address: http, workers hop")
    assert API not in line and ADMIN not in line


def test_posture_with_the_insecure_admin_flag():
    line, warn = _posture("10.1.2.3", insecure=True)
    assert "/admin OPEN" in line and warn
    assert "/v1, /admin, /metrics" in line


# ---- through `mmgate serve`: the flags, files and env into the config and the posture line


def test_serve_with_no_new_flags_keeps_todays_keys(served, monkeypatch, caplog):
    monkeypatch.setenv("VLLM_API_KEY", "env,key")  # one key, comma and all, as vLLM reads it
    with caplog.at_level(logging.INFO, logger="mmgate.security"):
        config = served("--api-key", API)
    assert config.api_keys == [API, "env,key"]
    assert config.admin_api_keys == [] and config.admin_enabled
    assert config.metrics_auth == "open"
    (record,) = caplog.records
    assert record.levelno == logging.INFO
    assert "security posture on 127.0.0.1:8000" in record.getMessage()
    assert API not in caplog.text and "env,key" not in caplog.text


def test_serve_reads_key_files_and_env(served, monkeypatch, tmp_path, caplog):
    (tmp_path / "api").write_text("# apps\nfile-k1\nfile-k2\n")
    (tmp_path / "admin").write_text(ADMIN + "\n")
    monkeypatch.setenv("MMGATE_API_KEYS", "env-k1,env-k2")
    monkeypatch.setenv("MMGATE_ADMIN_API_KEYS", "env-admin")
    with caplog.at_level(logging.INFO, logger="mmgate.security"):
        config = served(
            "--host",
            "0.0.0.0",
            "--api-key-file",
            str(tmp_path / "api"),
            "--admin-api-key-file",
            str(tmp_path / "admin"),
            "--metrics-auth",
            "api-key",
        )
    assert config.api_keys == ["file-k1", "file-k2", "env-k1", "env-k2"]
    assert config.admin_api_keys == [ADMIN, "env-admin"] and config.admin_enabled
    assert config.metrics_auth == "api-key"
    (record,) = caplog.records
    assert record.levelno == logging.WARNING  # plain text on 0.0.0.0
    for key in (ADMIN, "env-admin", "file-k1", "env-k1"):
        assert key not in caplog.text


def test_serve_turns_admin_off_on_a_non_loopback_bind(served):
    assert not served("--host", "0.0.0.0").admin_enabled
    assert served("--host", "0.0.0.0", "--insecure-open-admin").admin_enabled


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--metrics-auth", "api-key"], "--metrics-auth api-key needs an API key"),
        (["--metrics-auth", "admin"], "--metrics-auth admin needs a key"),
        (["--api-key-file", "/nonexistent/keys"], "cannot read a key file: /nonexistent/keys"),
    ],
)
def test_serve_refuses_what_cannot_work(served, capsys, argv, says):
    with pytest.raises(SystemExit):
        served(*argv)
    assert says in capsys.readouterr().err


@pytest.mark.parametrize(
    ("cert_reqs", "expected"),
    [(0, "http TLS;"), (2, "http TLS, client certificate required;")],
)
def test_posture_names_the_http_tls(cert_reqs: int, expected: str) -> None:
    http_tls = HttpTls(keyfile="k.pem", certfile="c.pem", ca_certs="ca.pem", cert_reqs=cert_reqs)
    surfaces = Surfaces(api=("k",), admin=("k",), metrics=())
    line, _ = posture("127.0.0.1", 8000, surfaces, False, False, [], http_tls)
    assert expected in line
    assert "plain text (no TLS)" not in line


def test_posture_names_the_rate_limits() -> None:
    surfaces = Surfaces(api=("k",), admin=("k",), metrics=())
    per_caller = Policy(requests=Limit(5, 5))
    limits = RateLimits(Limit(50, 8), per_caller, {"auth:red": per_caller})
    line, _ = posture("127.0.0.1", 8000, surfaces, False, False, [], None, limits)
    assert "rate limits 50 requests/s in all, per caller (1 with their own);" in line
    line, _ = posture("127.0.0.1", 8000, surfaces, False, False, [])
    assert "rate limits none;" in line
