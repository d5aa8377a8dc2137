from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.engines import ReferenceEngine, WorkerProcess


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory) -> Path:
    # Built once per machine (deterministic); MMGATE_CACHE or ~/.cache/mmgate by default.
    from engine_server.tiny_models import default_cache_root

    return default_cache_root()


@pytest.fixture(scope="session")
def text_model(model_cache) -> Path:
    from engine_server.tiny_models import ensure_model

    return ensure_model("text", model_cache)


@pytest.fixture(scope="session")
def vision_model(model_cache) -> Path:
    from engine_server.tiny_models import ensure_model

    return ensure_model("vision", model_cache)


@pytest.fixture(scope="session")
def embedding_model(model_cache) -> Path:
    from engine_server.tiny_models import ensure_model

    return ensure_model("embedding", model_cache)


def _worker(model: Path, tmp_path_factory, name: str, **extra) -> Iterator[WorkerProcess]:
    worker = WorkerProcess(model, tmp_path_factory.mktemp("logs") / f"{name}.log", **extra)
    try:
        yield worker.wait_ready()
    finally:
        worker.stop()


@pytest.fixture(scope="session")
def text_worker(text_model, tmp_path_factory) -> Iterator[WorkerProcess]:
    # A random-weight model would pad JSON with whitespace until max_tokens; a vLLM engine
    # argument passed through `mmgate engine` keeps structured outputs compact.
    compact_json = {"backend": "xgrammar", "disable_any_whitespace": True}
    yield from _worker(
        text_model, tmp_path_factory, "text-worker", structured_outputs_config=compact_json
    )


@pytest.fixture(scope="module")
def text_reference(text_model) -> Iterator[ReferenceEngine]:
    ref = ReferenceEngine(text_model)
    yield ref
    ref.close()
