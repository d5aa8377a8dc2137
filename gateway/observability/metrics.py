"""Prometheus metrics of one gateway: requests, latency, TTFT, TPOT, preprocessing, workers.

Each app gets its own registry (several gateways in one process, e.g. tests, do not collide).
Worker state is read from the pool at scrape time, so it can never go stale.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from gateway.observability.process_metrics import MergedSnapshots, snapshot_path, write_snapshot

if TYPE_CHECKING:
    from multimodal.media_cache import MediaCache

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
PREPROCESS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class GatewayMetrics:
    """`multiprocess_dir`: one of several gateway processes (`--api-server-count`), process
    `process_index`, whose /metrics answers for all of them (process_metrics.py); None: the
    only process."""

    def __init__(self, multiprocess_dir: Path | None = None, process_index: int = 0) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self._local: list[Collector] = []  # read from this process's state at scrape time
        self._exposed = r  # what /metrics reads
        self._snapshot: Path | None = None
        if multiprocess_dir is not None:
            self._exposed = CollectorRegistry()
            MultiProcessCollector(self._exposed, str(multiprocess_dir))
            self._exposed.register(MergedSnapshots(multiprocess_dir))
            self._snapshot = snapshot_path(multiprocess_dir, process_index)
        self.requests = Counter(
            "mmgate_requests", "HTTP requests by route and status", ["route", "status"], registry=r
        )
        self.latency = Histogram(
            "mmgate_request_duration_seconds",
            "HTTP request latency, to the last byte of the response",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge(
            "mmgate_requests_in_flight",
            "HTTP requests being served",
            ["route"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.ttft = Histogram(
            "mmgate_time_to_first_token_seconds",
            "from sending Generate to the first output token",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "mmgate_time_per_output_token_seconds",
            "mean time between output tokens after the first, per generation",
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.preprocess = Histogram(
            "mmgate_preprocess_duration_seconds",
            "image work per request: fetch (downloads) and process (decode, then tensors)",
            ["stage"],
            buckets=PREPROCESS_BUCKETS,
            registry=r,
        )
        self.images = Counter("mmgate_images", "images preprocessed", registry=r)
        self.prompt_tokens = Counter("mmgate_prompt_tokens", "prompt tokens sent", registry=r)
        self.generation_tokens = Counter(
            "mmgate_generation_tokens", "output tokens received", registry=r
        )

        self.worker_requests = Counter(
            "mmgate_worker_requests", "requests routed to each worker", ["worker"], registry=r
        )
        self.routing = Counter(
            "mmgate_routing_decisions",
            "routing decisions by policy and outcome (balanced, cache_hit, cache_miss, imbalanced)",
            ["policy", "outcome"],
            registry=r,
        )
        self.cache_matched_tokens = Histogram(
            "mmgate_cache_aware_matched_tokens",
            "prompt prefix (tokens) the chosen worker had seen, on cache-aware hits",
            buckets=(16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384),
            registry=r,
        )
        self.retries = Counter(
            "mmgate_retries",
            "requests retried on another worker before their first token",
            registry=r,
        )
        self.queue_wait = Histogram(
            "mmgate_queue_wait_seconds",
            "time generation requests waited for admission",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tool_calls = Counter(
            "mmgate_tool_calls_parsed",
            "tool calls read out of model output (--tool-call-parser)",
            ["parser"],
            registry=r,
        )
        self.tool_parse_failures = Counter(
            "mmgate_tool_call_parse_failures",
            "outputs with tool-call markup the parser could not read (returned as content)",
            ["parser"],
            registry=r,
        )
        self.shm_bytes = Counter(
            "mmgate_shm_bytes",
            "tensor bytes handed to workers through /dev/shm segments instead of the socket",
            registry=r,
        )
        self.shm_write_failures = Counter(
            "mmgate_shm_write_failures",
            "tensors that could not be written to /dev/shm (full, missing) and went inline",
            registry=r,
        )
        self.workers_refused = Counter(
            "mmgate_workers_refused",
            "times a worker was refused (other_model: it serves another model than the gateway)",
            ["reason"],
            registry=r,
        )
        self.rejected = Counter(
            "mmgate_rejected_requests",
            "requests refused by admission control (queue_full: 429, timeout: 503)",
            ["reason"],
            registry=r,
        )

        self.send_once_hits = Counter(
            "mmgate_mm_send_once_hits",
            "media items (every occurrence) left out of a request because the worker's item "
            "cache held them",
            registry=r,
        )
        self.send_once_bytes_saved = Counter(
            "mmgate_mm_send_once_bytes_saved",
            "tensor bytes not sent to workers because their item caches held the items",
            registry=r,
        )
        self.send_once_resends = Counter(
            "mmgate_mm_send_once_resends",
            "requests sent again in full because a worker's item cache lacked items the "
            "gateway left out (a restarted or flushed worker)",
            registry=r,
        )

        # Several processes share one response store (sqlite_store), each reporting its size
        # after each of its writes, in the order of the writes: the most recent report is the
        # store's (summed, it would count the store once per process).
        self.store_bytes = Gauge(
            "mmgate_responses_store_bytes",
            "bytes of stored responses held",
            registry=r,
            multiprocess_mode="mostrecent",
        )
        self.store_entries = Gauge(
            "mmgate_responses_store_entries",
            "stored responses held",
            registry=r,
            multiprocess_mode="mostrecent",
        )
        self.store_evictions = Counter(
            "mmgate_responses_store_evictions",
            "stored responses dropped by the store's bounds (size: pushed out by newer ones, "
            "age: older than --responses-store-max-age, too_large: larger than the store)",
            ["reason"],
            registry=r,
        )

    def evicted(self, reason: str, count: int = 1) -> None:
        """The response store's report (gateway.api.responses.memory_store.StoreObserver)."""
        self.store_evictions.labels(reason).inc(count)

    def sized(self, entries: int, total_bytes: int) -> None:
        self.store_entries.set(entries)
        self.store_bytes.set(total_bytes)

    def watch(self, collector: Collector, gateway_wide: bool = False) -> None:
        """A collector read at scrape time. Several processes: one reading this process's
        own state is merged with the others' (`publish`); a `gateway_wide` one (shared
        state) is read once."""
        self.registry.register(collector)
        if self._snapshot is None:
            return
        if gateway_wide:
            self._exposed.register(collector)
        else:
            self._local.append(collector)

    def publish(self) -> None:
        """Several processes: this one's scrape-time metrics, for whichever is scraped."""
        if self._snapshot is not None:
            write_snapshot(self._snapshot, self._local)

    def observe_generation(
        self,
        ttft: float | None,
        decode_seconds: float,
        output_tokens: int,
        longest_choice: int,
        prompt_tokens: int,
    ) -> None:
        """`decode_seconds` runs from the first token to the end; the longest choice (of n)
        paces it, so time per output token is decode_seconds / (longest_choice - 1)."""
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(output_tokens)
        if ttft is None:  # no token timings (a non-streamed call)
            return
        self.ttft.observe(ttft)
        if longest_choice > 1:
            self.tpot.observe(decode_seconds / (longest_choice - 1))

    def gateway_wide(self) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
        """What /metrics shows, by sample name then sorted labels (several processes: the
        whole gateway's), for the admin view."""
        self.publish()
        found: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
        for family in self._exposed.collect():
            for sample in family.samples:
                labels = tuple(sorted(sample.labels.items()))
                found.setdefault(sample.name, {})[labels] = sample.value
        return found

    def exposition(self) -> bytes:
        self.publish()
        return generate_latest(self._exposed)


class GaugesFrom(Collector):
    """Gauges computed at scrape time: `read()` yields (labels, value) per metric name."""

    def __init__(
        self,
        specs: Iterable[tuple[str, str, list[str]]],
        read: Callable[[], dict[str, list[tuple[list[str], float]]]],
    ) -> None:
        self.specs = list(specs)
        self.read = read

    def collect(self) -> Iterator[Metric]:
        values = self.read()
        for name, documentation, labels in self.specs:
            family = GaugeMetricFamily(name, documentation, labels=labels)
            for label_values, value in values.get(name, []):
                family.add_metric(label_values, value)
            yield family


class MediaCacheCollector(Collector):
    """The preprocessed-media cache's counters (multimodal.media_cache), read at scrape time;
    `current()` is the cache in use (None: off, or no model yet), so a cache replaced with the
    services starts its counts again, as a restarted process would."""

    def __init__(self, current: Callable[[], MediaCache | None]) -> None:
        self.current = current

    def collect(self) -> Iterator[Metric]:
        cache = self.current()
        stats = cache.stats() if cache is not None else None
        counters = (
            ("mmgate_mm_cache_hits", "media items the cache held (not decoded or preprocessed)"),
            ("mmgate_mm_cache_misses", "media items the cache did not hold"),
            ("mmgate_mm_cache_evictions", "items pushed out of the cache by newer ones"),
        )
        values = (stats.hits, stats.misses, stats.evictions) if stats else (0, 0, 0)
        for (name, documentation), value in zip(counters, values):
            yield CounterMetricFamily(name, documentation, value=value)
        yield GaugeMetricFamily(
            "mmgate_mm_cache_bytes",
            "bytes of preprocessed items held (--mm-processor-cache-gb)",
            value=stats.bytes if stats else 0,
        )
