"""Load and leaks (benchmarks/soak.py, its figures in benchmarks/RESULTS.md): the real gateway
holds 1,000 concurrent streams from a fast worker, a third of their clients dropping the
connection mid-stream, three rounds; every engine request is finished or cancelled, the
gateway's RSS and open fds come back within 10% of their level after the first round, and a
probe request's p99 stays under the stated bound."""

from __future__ import annotations

import asyncio

from benchmarks.soak import PROBE_P99_BOUND, checks, soak
from tests.support import refuse_in_fast_tests


def test_a_thousand_streams_leave_nothing_behind(text_model, tmp_path):
    refuse_in_fast_tests("the soak's gateway and worker")
    results = asyncio.run(soak(text_model, streams=1000, rounds=3, workdir=tmp_path))
    verdicts = checks(results, PROBE_P99_BOUND)
    failing = {name: figures for name, (ok, figures) in verdicts.items() if not ok}
    assert not failing, failing
    assert len(verdicts) == 4
