"""SMG 1.13 (the Rust router, from PyPI) as a peer in tests: launched in front of workers."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.support import refuse_in_fast_tests
from tests.support.engines import free_port


def smg_binary() -> str:
    found = shutil.which("smg", path=str(Path(sys.executable).parent)) or shutil.which("smg")
    if not found:
        pytest.fail("smg is not installed: scripts/install.sh --test installs smg==1.13.0")
    return found


@contextmanager
def run_smg(
    workers: list[str], log_path: Path, *extra: str, metrics: int | None = None
) -> Iterator[str]:
    """SMG routing to `workers` (host:port), yielding its base URL once it serves a model;
    `extra`: more `smg launch` flags (e.g. --mm-processing worker); `metrics`: the port of its
    Prometheus endpoint (default: any free one)."""
    refuse_in_fast_tests("smg")
    port, metrics = free_port(), metrics or free_port()
    urls = [arg for worker in workers for arg in ("--worker-urls", f"grpc://{worker}")]
    cmd = [
        smg_binary(), "launch", "--host", "127.0.0.1", "--port", str(port), *urls,
        # it binds its metrics on 0.0.0.0 unless told
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics), *extra,
    ]  # fmt: skip
    with open(log_path, "w+") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=log, env={**os.environ, "NO_COLOR": "1"})
        base = f"http://127.0.0.1:{port}"
        try:
            _wait_for_model(proc, base, log)
            yield base
        finally:
            proc.terminate()
            proc.wait(timeout=20)


def smg_client(base: str):
    from openai import OpenAI

    return OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)


def _wait_for_model(proc: subprocess.Popen, base: str, log) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            if httpx.get(f"{base}/v1/models", timeout=2).json().get("data"):
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.5)
    log.seek(0)
    pytest.fail(f"SMG did not register the worker:\n{log.read()[-4000:]}")
