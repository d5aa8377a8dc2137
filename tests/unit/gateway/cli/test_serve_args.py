"""`mmgate serve` refuses bad worker addresses at start, before anything is served."""

from __future__ import annotations

import pytest

from gateway.cli.serve import main


@pytest.mark.parametrize("flag", ["--worker", "--worker-dns"])
def test_a_malformed_worker_address_is_a_usage_error(flag, tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--model", str(tmp_path), flag, "http://engine:50051"])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert "must look like grpc://HOST:PORT, got 'http://engine:50051'" in error
