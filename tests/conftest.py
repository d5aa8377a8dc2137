"""Fixtures every test may use (tiny model directories, built once per machine), and the fast
loop's boundary.

`pytest -m "not slow"` is the fast loop. Slow is every test under tests/e2e (marked here) and any
other marked `slow`: whatever starts vLLM (an engine worker or a reference AsyncLLM), a gateway,
SMG or a subprocess. A fast test that starts one of the peers in tests/support fails at once,
naming itself, so the boundary holds as tests are added.

The exhaustive reference comparisons (a test parametrized over hundreds of images, sizes or
parser outputs against transformers or vLLM) run whole in the full suite and as a fixed sample
in the fast loop: of a test function with more than SAMPLE_ABOVE cases, about one in
SAMPLE_EVERY (the first always, the others chosen by a hash of their id, so the same ones every
run and spread over the parameters) stays fast; the rest are marked `slow` and `reference`.
A test function marked `sampled` is sampled so whatever its count (comparisons that each ask
vLLM's own processor for a reference, a second or so a case). `pytest -m reference` runs just
what the loop leaves out.
"""

from __future__ import annotations

import subprocess
import sys
import zlib
from collections import defaultdict
from pathlib import Path

import pytest

from tests import support

E2E = Path(__file__).parent / "e2e"
VLLM_INSPECTION = ["-m", "vllm.model_executor.models.registry"]
SAMPLE_ABOVE = 12  # cases of one test function that all run in the fast loop
SAMPLE_EVERY = 10


def pytest_configure(config: pytest.Config) -> None:
    # A Python child (our CLI, a script under test) makes a test slow too; other children
    # (a library asking `lscpu`, say) do not, nor does vLLM's model registry inspecting a
    # model class in a child once per machine (its cache in ~/.cache/vllm is cold on a fresh
    # one) when a fast test asks vLLM's offline tokenizer or processor for a reference.
    start = subprocess.Popen.__init__

    def guarded(self: subprocess.Popen, args, *rest, **kwargs) -> None:
        command = [args] if isinstance(args, (str, bytes)) else list(args)
        if command and command[0] == sys.executable and command[1:3] != VLLM_INSPECTION:
            support.refuse_in_fast_tests(f"a Python subprocess ({' '.join(command[1:3])} ...)")
        start(self, args, *rest, **kwargs)

    subprocess.Popen.__init__ = guarded


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    cases: dict[tuple[Path, str], list[pytest.Item]] = defaultdict(list)
    for item in items:
        if E2E in item.path.parents:
            item.add_marker(pytest.mark.slow)
        elif isinstance(item, pytest.Function) and hasattr(item, "callspec"):
            cases[item.path, item.originalname].append(item)
    for parametrized in cases.values():
        if len(parametrized) > SAMPLE_ABOVE or parametrized[0].get_closest_marker("sampled"):
            for item in parametrized[1:]:
                if zlib.crc32(item.nodeid.encode()) % SAMPLE_EVERY:
                    item.add_marker(pytest.mark.reference)
                    item.add_marker(pytest.mark.slow)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # Before the item's fixtures are set up: they may be what starts a peer.
    support.running_fast_test = None if item.get_closest_marker("slow") else item.nodeid


@pytest.fixture(scope="session")
def model_cache() -> Path:
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
