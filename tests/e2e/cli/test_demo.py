"""The README's first command: `mmgate demo` runs the whole path and prints a request to try."""

from __future__ import annotations

import subprocess
import sys

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
