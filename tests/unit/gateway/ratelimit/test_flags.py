"""The rate-limit flags and config (SMG's names and YAML shape): labelled keys with ':' in
them, the config's checks, the global rate divided among processes, and nothing made when no
flag is given."""

from __future__ import annotations

import pytest

from gateway.cli import serve
from gateway.ratelimit.callers import canonical_caller, key_caller, key_hash, parse_labelled_key
from gateway.ratelimit.policy import Limit, Policy, parse_config

KEY = "sk-live:abc:def"  # a key holding ':'


def test_a_labelled_key_splits_at_the_first_colon():
    assert parse_labelled_key(f"team-red:{KEY}") == ("team-red", KEY)
    assert parse_labelled_key(" a.b_c-1 : k ") == ("a.b_c-1", "k")


@pytest.mark.parametrize("line", ["no-colon-secret0", "label:", "bad label:secret1", ":secret2"])
def test_a_malformed_labelled_key_is_refused_without_showing_the_key(line):
    with pytest.raises(ValueError) as error:
        parse_labelled_key(line)
    assert "secret" not in str(error.value)


def test_a_key_s_caller_is_its_label_else_its_hash():
    assert key_caller(KEY, {KEY: "team-red"}) == "auth:team-red"
    assert key_caller(KEY, {}) == f"auth:sha256:{key_hash(KEY)}"
    assert len(key_hash(KEY)) == 12 and KEY not in key_caller(KEY, {})


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("auth:team-red", True),
        ("auth:sha256:0123456789ab", True),
        ("auth:sha256:0123", False),
        ("ip:10.0.0.1", True),
        ("ip:::1", True),
        ("ip:0:0:0:0:0:0:0:1", False),  # never how an address is written
        ("anonymous", True),
        ("team-red", False),  # SMG's check: a bare label copied without auth:
        ("auth:", False),
    ],
)
def test_only_callers_a_request_can_be_are_accepted(text, ok):
    assert canonical_caller(text) is ok


def test_the_config_in_smg_s_shape():
    default, tenants = parse_config(
        {
            "default_policy": {"requests_per_second": 2, "generated_tokens_per_second": 50},
            "tenants": [
                {"tenant_key": "auth:team-red", "requests_per_second": 10, "request_burst": 30},
                {"tenant_key": "auth:sha256:0123456789ab"},
            ],
        },
        labels={"team-red"},
    )
    assert default == Policy(Limit(2, 2), Limit(50, 50))  # burst: one second's worth
    assert tenants == {
        "auth:team-red": Policy(requests=Limit(10, 30)),  # replaces the default whole
        "auth:sha256:0123456789ab": Policy(),  # exempt
    }


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({}, "default_policy is required"),
        ({"default_policy": {"requests_per_minute": 60}}, "unknown field(s) requests_per_minute"),
        ({"default_policy": {}, "tenant": []}, "unknown field(s) tenant"),
        ({"default_policy": {"requests_per_second": 0}}, "must be a number above 0"),
        ({"default_policy": {"request_burst": 3}}, "request_burst without requests_per_second"),
        ({"default_policy": {}, "tenants": [{"requests_per_second": 1}]}, "missing tenant_key"),
        ({"default_policy": {}, "tenants": [{"tenant_key": "team-red"}]}, "none a request"),
        ({"default_policy": {}, "tenants": [{"tenant_key": "auth:nobody"}]}, "no key has"),
        (
            {"default_policy": {}, "tenants": [{"tenant_key": "anonymous"}] * 2},
            "listed twice",
        ),
    ],
)
def test_a_config_that_cannot_mean_what_it_says_is_refused(data, says):
    with pytest.raises(ValueError, match=None) as error:
        parse_config(data, labels=set())
    assert says in str(error.value)


def test_no_rate_limit_flag_makes_no_limiter(served):
    config = served("--api-key", "k")
    assert config.rate_limits is None and config.api_key_labels == {}
    assert served("--rate-limit-tokens-per-second", "0").rate_limits is None  # SMG: 0 is off


def test_the_global_rate_bursts_to_max_in_flight_divided_among_processes(served, monkeypatch):
    from gateway.server.processes import supervisor

    monkeypatch.setattr(supervisor.Supervisor, "run", lambda self: 0)
    built: list = []
    monkeypatch.setattr(
        supervisor.Supervisor, "__init__", lambda self, n, config, *a: built.append(config)
    )
    one = served("--rate-limit-tokens-per-second", "10", "--max-in-flight", "8")
    assert one.rate_limits.global_requests == Limit(10, 8) and one.rate_limits.default is None
    base = ["--model", ".", "--worker", "grpc://127.0.0.1:9"]
    argv = ["--rate-limit-tokens-per-second", "10", "--max-in-flight", "8"]
    assert serve.main([*base, *argv, "--api-server-count", "4"]) == 0
    assert built[-1].rate_limits.global_requests == Limit(2.5, 2)


def test_labelled_keys_from_flags_files_and_env_are_api_keys_too(served, tmp_path, monkeypatch):
    (tmp_path / "keys").write_text(f"# tenants\nteam-red:{KEY}\n")
    (tmp_path / "plain").write_text("plain:key:stays:whole\n")
    (tmp_path / "limits.yaml").write_text(
        "default_policy:\n  requests_per_second: 1\n"
        "tenants:\n  - tenant_key: auth:team-blue\n    requests_per_second: 5\n"
    )
    monkeypatch.setenv("MMGATE_TENANT_API_KEYS", "team-blue:b1,team-blue:b2")
    config = served(
        "--api-key-file",
        str(tmp_path / "plain"),
        "--tenant-api-key-file",
        str(tmp_path / "keys"),
        "--tenant-api-key",
        "ops:o1",
        "--tenant-rate-limit-enabled",
        "--tenant-rate-limit-config",
        str(tmp_path / "limits.yaml"),
    )
    assert config.api_keys == ["plain:key:stays:whole", "o1", KEY, "b1", "b2"]
    assert config.api_key_labels == {
        "o1": "ops",
        KEY: "team-red",
        "b1": "team-blue",
        "b2": "team-blue",
    }
    assert config.rate_limits.policy("auth:team-blue") == Policy(requests=Limit(5, 5))
    assert config.rate_limits.policy("auth:ops") == Policy(requests=Limit(1, 1))


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--tenant-rate-limit-enabled"], "needs --tenant-rate-limit-config"),
        (["--tenant-rate-limit-config", "x.yaml"], "needs --tenant-rate-limit-enabled"),
        (
            ["--tenant-rate-limit-enabled", "--tenant-rate-limit-config", "/nonexistent.yaml"],
            "cannot read /nonexistent.yaml",
        ),
        (["--tenant-api-key", "no-label-secret"], "--tenant-api-key: a labelled key is"),
        (["--tenant-api-key", "a:k", "--tenant-api-key", "b:k"], "two labels"),
        (["--rate-limit-tokens-per-second", "-1"], "must be a rate of at least 0"),
    ],
)
def test_serve_refuses_rate_limit_flags_that_cannot_work(served, capsys, argv, says):
    with pytest.raises(SystemExit):
        served(*argv)
    err = capsys.readouterr().err
    assert says in err
    assert "no-label-secret" not in err
