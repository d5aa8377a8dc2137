"""The README's first command: `mmgate demo` runs the whole path and prints a request to try."""

from __future__ import annotations

import contextlib
import queue
import subprocess
import sys
import threading
import time

import httpx

from tests.support.engines import ROOT


def test_demo_answers_an_image_request_through_the_gateway():
    run = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "demo", "--port", "0", "--max-tokens", "5"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = dict(line.split(":", 1) for line in run.stdout.splitlines() if ": " in line[:16])
    assert lines["finish reason"].strip() == "length"
    assert int(lines["prompt tokens"].split()[0]) > 20  # the image's placeholders are in
    assert "curl http://127.0.0.1:" in run.stdout
    assert "Traceback" not in run.stderr


def test_demo_serve_prints_the_playgrounds_url_and_serves_it():
    flags = ["--port", "0", "--max-tokens", "2", "--serve"]
    demo = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "demo", *flags],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    # A thread reads, so that a demo which never says anything fails the test, not hangs it.
    threading.Thread(target=lambda: [lines.put(line) for line in demo.stdout], daemon=True).start()
    try:
        url = None
        deadline = time.monotonic() + 600
        while url is None and time.monotonic() < deadline and demo.poll() is None:
            with contextlib.suppress(queue.Empty):
                line = lines.get(timeout=1)
                if line.startswith("playground:"):
                    url = line.split()[1]
        assert url is not None and url.startswith("http://127.0.0.1:"), "no playground line"
        page = httpx.get(url, timeout=30)
        assert page.status_code == 200 and "<title>mmgate playground</title>" in page.text
    finally:
        demo.terminate()
        demo.wait(60)
