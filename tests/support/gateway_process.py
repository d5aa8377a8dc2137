"""`mmgate serve` in a subprocess for tests, ready once /ready answers 200 (with several
processes, `--api-server-count`: once every one is ready)."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.support import refuse_in_fast_tests
from tests.support.engines import ROOT, free_port


class GatewayProcess:
    def __init__(
        self,
        model: Path,
        workers: list[str],
        log_path: Path,
        *extra: str,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        """`tls`: the gateway serves https (`extra` holds its --ssl-* flags) and this client
        context (its CA, and a client certificate for mutual TLS) reaches it."""
        refuse_in_fast_tests("`mmgate serve`")
        self.port = free_port()
        self.tls = tls
        self.base_url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self.log_path = log_path
        cmd = [
            sys.executable,
            "-m",
            "gateway.cli",
            "serve",
            "--model",
            str(model),
            "--port",
            str(self.port),
            *extra,
        ]
        # The gateway tests run as one process in CI; MMGATE_TEST_API_SERVER_COUNT=2 runs
        # them against a multi-process gateway (issue 29's check, by hand).
        count = os.environ.get("MMGATE_TEST_API_SERVER_COUNT")
        if count and "--api-server-count" not in extra:
            cmd += ["--api-server-count", count]
        for worker in workers:  # host:port, or a URL (grpcs://host:port)
            cmd += ["--worker", worker if "://" in worker else f"grpc://{worker}"]
        self._log = open(log_path, "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=os.environ.copy(), stdout=self._log, stderr=self._log
        )

    def wait_ready(self, timeout: float = 60.0) -> GatewayProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited:\n{self.log_path.read_text()[-3000:]}")
            try:
                ready = httpx.get(f"{self.base_url}/ready", timeout=2, verify=self.tls or True)
                if ready.status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"gateway not ready:\n{self.log_path.read_text()[-3000:]}")

    def client(self):
        from openai import OpenAI

        http = httpx.Client(verify=self.tls, timeout=120) if self.tls else None
        return OpenAI(
            base_url=f"{self.base_url}/v1",
            api_key="x",
            max_retries=0,
            timeout=120,
            http_client=http,
        )

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()


def read_chat_stream(stream) -> tuple[str, str | None, object, list]:
    """An openai SDK chat stream (one choice) as (text, finish_reason, usage, delta roles)."""
    pieces, finish, usage, roles = [], None, None, []
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            roles.append(choice.delta.role)
            pieces.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    return "".join(pieces), finish, usage, roles
