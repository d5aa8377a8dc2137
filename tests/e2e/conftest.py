"""Engines shared by the end-to-end tests: one text worker for the whole session (publishing
its KV cache events, --kv-events-config), vLLM's own AsyncLLM on the same model as the
reference per module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.engines import ReferenceEngine, WorkerProcess, serve_worker


@pytest.fixture(scope="session")
def text_worker(text_model, tmp_path_factory) -> Iterator[WorkerProcess]:
    # A random-weight model would pad JSON with whitespace until max_tokens; a vLLM engine
    # argument passed through `mmgate engine` keeps structured outputs compact.
    compact_json = {"backend": "xgrammar", "disable_any_whitespace": True}
    yield from serve_worker(
        text_model,
        tmp_path_factory,
        "text-worker",
        structured_outputs_config=compact_json,
        kv_events_config=kv_events_config(tmp_path_factory.mktemp("kv-events")),
    )


def kv_events_config(directory: Path) -> dict:
    """vLLM's KV event publisher on ipc sockets (no port to collide; vLLM binds an ipc or a
    wildcard tcp endpoint and connects to any other tcp one), with replay."""
    return {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"ipc://{directory}/events",
        "replay_endpoint": f"ipc://{directory}/replay",
    }


@pytest.fixture(scope="module")
def text_reference(text_model) -> Iterator[ReferenceEngine]:
    ref = ReferenceEngine(text_model)
    yield ref
    ref.close()
