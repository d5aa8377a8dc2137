"""vLLM's EngineCore never outlives `mmgate engine`: with vLLM's multiprocessing on (the
default outside tests: the engine core in a child, spawned on CPUs), the worker ended by
SIGKILL (no code runs), SIGTERM (the graceful drain) or SIGINT leaves no process behind, its
reaper (engine_server/reaper.py) included."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import psutil
import pytest

from tests.support.engines import WorkerProcess

MULTIPROCESSING = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}


def wait_gone(processes: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    _, alive = psutil.wait_procs(processes, timeout=timeout)
    return alive


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=str)
def test_no_engine_process_outlives_the_worker(text_model, tmp_path, sig):
    worker = WorkerProcess(text_model, tmp_path / "worker.log", env=MULTIPROCESSING)
    try:
        worker.wait_ready()
        children = psutil.Process(worker.proc.pid).children(recursive=True)
        assert any("EngineCore" in " ".join(c.cmdline()) for c in children), children
        os.kill(worker.proc.pid, sig)  # the worker alone, not its process group
        worker.proc.wait(60)
        started = time.monotonic()
        alive = wait_gone(children, timeout=30)
        assert not alive, f"left behind after {sig!r}: {[c.cmdline() for c in alive]}"
        assert time.monotonic() - started < 30
    finally:
        if worker.proc.poll() is None:
            worker.kill()
        for child in psutil.Process().children(recursive=True):
            # another test's finished child may be a zombie here: it holds no engine
            with contextlib.suppress(psutil.Error):
                if "EngineCore" in " ".join(child.cmdline()):
                    child.kill()


def test_no_engine_process_outlives_a_killed_demo(tmp_path):
    """`mmgate demo --serve` runs the worker in its own process: killed, it leaves nothing."""
    import subprocess
    import sys

    from tests.support.engines import ROOT

    log = open(tmp_path / "demo.log", "w")  # noqa: SIM115 - closed below
    demo = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "demo", "--serve", "--port", "0"],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while "curl http://127.0.0.1:" not in (tmp_path / "demo.log").read_text():
            assert demo.poll() is None and time.monotonic() < deadline, (
                tmp_path / "demo.log"
            ).read_text()[-3000:]
            time.sleep(0.5)
        children = psutil.Process(demo.pid).children(recursive=True)
        assert any("EngineCore" in " ".join(c.cmdline()) for c in children), children
        os.kill(demo.pid, signal.SIGKILL)
        demo.wait(30)
        alive = wait_gone(children, timeout=30)
        assert not alive, [c.cmdline() for c in alive]
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
        log.close()
