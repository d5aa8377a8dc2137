"""Scrape-time metrics of several gateway processes, merged into one gateway's."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from gateway.observability.metrics import GaugesFrom
from gateway.observability.process_metrics import MergedSnapshots, snapshot_path, write_snapshot

SPECS = [
    ("mmgate_worker_healthy", "h", ["worker"]),
    ("mmgate_worker_circuit_state", "c", ["worker"]),
    ("mmgate_worker_assigned_requests", "a", ["worker"]),
]


def _pool_view(healthy: dict, circuit: dict, assigned: dict) -> GaugesFrom:
    return GaugesFrom(
        SPECS,
        lambda: {
            "mmgate_worker_healthy": [([w], v) for w, v in healthy.items()],
            "mmgate_worker_circuit_state": [([w], v) for w, v in circuit.items()],
            "mmgate_worker_assigned_requests": [([w], v) for w, v in assigned.items()],
        },
    )


class _Hits:
    def __init__(self, hits: int) -> None:
        self.hits = hits

    def collect(self):
        yield CounterMetricFamily("mmgate_mm_cache_hits", "hits", value=self.hits)


def _scrape(directory) -> dict[tuple[str, tuple], float]:
    registry = CollectorRegistry()
    registry.register(MergedSnapshots(directory))
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_per_process_views_merge_into_one_gateway(tmp_path):
    write_snapshot(
        snapshot_path(tmp_path, 0),
        [_pool_view({"a": 1, "b": 1}, {"a": 0, "b": 0}, {"a": 2, "b": 1}), _Hits(5)],
    )
    write_snapshot(
        snapshot_path(tmp_path, 1),
        [_pool_view({"a": 1, "b": 0}, {"a": 2, "b": 0}, {"a": 3}), _Hits(7)],
    )
    merged = _scrape(tmp_path)
    w = (("worker", "a"),), (("worker", "b"),)
    assert merged[("mmgate_worker_assigned_requests", w[0])] == 5  # summed
    assert merged[("mmgate_worker_assigned_requests", w[1])] == 1
    assert merged[("mmgate_worker_healthy", w[0])] == 1  # healthy only if healthy everywhere
    assert merged[("mmgate_worker_healthy", w[1])] == 0
    assert merged[("mmgate_worker_circuit_state", w[0])] == 2  # the most open circuit
    assert merged[("mmgate_mm_cache_hits_total", ())] == 12

    snapshot_path(tmp_path, 1).unlink()  # its process died (the supervisor removes it)
    merged = _scrape(tmp_path)
    assert merged[("mmgate_worker_healthy", w[1])] == 1
    assert merged[("mmgate_mm_cache_hits_total", ())] == 5


def test_a_worker_gone_from_every_view_is_gone_from_the_scrape(tmp_path):
    write_snapshot(snapshot_path(tmp_path, 0), [_pool_view({"a": 1, "b": 1}, {}, {})])
    write_snapshot(snapshot_path(tmp_path, 0), [_pool_view({"a": 1}, {}, {})])
    assert ("mmgate_worker_healthy", (("worker", "b"),)) not in _scrape(tmp_path)
