"""benchmarks/mock_worker.py in a subprocess: a VllmEngine with no model, which starts in a
second, for tests of the gateway's own behaviour (processes, TLS) rather than generation."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support import ROOT, refuse_in_fast_tests
from tests.support.engines import free_port


class MockWorker:
    def __init__(self, model: Path, log: Path, *extra: str) -> None:
        refuse_in_fast_tests("a mock worker")
        self.port = free_port()
        self.url = f"grpc://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "benchmarks.mock_worker", "--model", str(model)]
        self._log = open(log, "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [*cmd, "--port", str(self.port), *extra], cwd=ROOT, stdout=self._log, stderr=self._log
        )

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self._log.close()
