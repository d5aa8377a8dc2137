"""/metrics as one gateway when it runs as several processes (`--api-server-count N`).

A scrape reaches one process, which answers for all of them:
- counters, histograms and gauges the code updates (requests, latency, tokens, ...) are kept in
  prometheus_client's multiprocess files (PROMETHEUS_MULTIPROC_DIR, set by the supervisor
  before any child starts) and summed over the processes, dead ones included for counters and
  histograms (their counts happened), live ones only for gauges (`livesum`);
- what each process reads from its own state at scrape time (its worker pool's view, its
  media cache) is written by every process to a snapshot file in the same directory about
  four times a second (and by the scraped one just before answering) and merged: summed, except the
  per-worker states in MERGE_MAX / MERGE_MIN (a worker is healthy only if every process finds
  it healthy; its circuit state is the most open one). A process's snapshot goes with it
  (removed by the supervisor when it dies), so a removed worker or a dead process leaves no
  stale series behind, which prometheus_client's multiprocess files cannot promise;
- what is already gateway-wide is read once, not summed: shared admission counts, and the size
  of the response store all processes share (its gauges are `mostrecent`: each process reports
  the whole store's size after its writes, in their order).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

SNAPSHOT_PREFIX = "snapshot_"
MERGE_MAX = frozenset(
    {"mmgate_worker_circuit_state", "mmgate_worker_draining", "mmgate_worker_refused"}
)
MERGE_MIN = frozenset({"mmgate_worker_healthy"})


def snapshot_path(directory: Path, index: int) -> Path:
    return directory / f"{SNAPSHOT_PREFIX}{index}.json"


def write_snapshot(path: Path, collectors: Iterable[Collector]) -> None:
    """This process's scrape-time metrics, replaced atomically (a reader never sees half)."""
    families = []
    for collector in collectors:
        for family in collector.collect():
            samples = [[s.name, s.labels, s.value] for s in family.samples]
            families.append([family.name, family.documentation, family.type, samples])
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_text(json.dumps(families))
    temporary.replace(path)


class MergedSnapshots(Collector):
    """Every process's snapshot, merged per sample."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, tuple[str, str, dict[tuple, tuple[str, dict, float]]]] = {}
        for path in sorted(self.directory.glob(f"{SNAPSHOT_PREFIX}*.json")):
            try:
                families = json.loads(path.read_text())
            except (OSError, ValueError):  # removed meanwhile (its process died)
                continue
            for name, documentation, kind, samples in families:
                _, _, series = merged.setdefault(name, (documentation, kind, {}))
                for sample_name, labels, value in samples:
                    key = (sample_name, tuple(sorted(labels.items())))
                    if key in series:
                        value = _combine(name, series[key][2], value)
                    series[key] = (sample_name, labels, value)
        for name, (documentation, kind, series) in merged.items():
            yield _family(name, documentation, kind, series.values())


def _combine(name: str, a: float, b: float) -> float:
    if name in MERGE_MAX:
        return max(a, b)
    if name in MERGE_MIN:
        return min(a, b)
    return a + b


def _family(
    name: str, documentation: str, kind: str, samples: Iterable[tuple[str, dict, float]]
) -> Metric:
    samples = list(samples)
    labels = sorted(samples[0][1]) if samples else []
    family: Metric
    if kind == "counter":
        family = CounterMetricFamily(name, documentation, labels=labels)
    else:
        family = GaugeMetricFamily(name, documentation, labels=labels)
    for sample_name, sample_labels, value in samples:
        if kind == "counter" and not sample_name.endswith("_total"):
            continue  # (a `_created` sample: meaningless once summed)
        family.add_metric([sample_labels[k] for k in labels], value)
    return family
