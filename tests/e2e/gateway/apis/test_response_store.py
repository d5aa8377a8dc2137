"""The response store under load through the real gateway: far more responses created (with the
openai SDK, several clients at once) than its bound holds; it stays within the bound, only the
least recently used go, the newest come back whole, and /metrics says so."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from tests.support.gateway_process import GatewayProcess

BOUND_MIB = 0.0625  # 64 KiB: a few dozen small responses
CREATED = 150
CLIENTS = 6


@pytest.fixture(scope="module")
def small_store(api_stack, tmp_path_factory):
    log = tmp_path_factory.mktemp("store") / "gateway.log"
    flags = (
        "--reasoning-parser", "qwen3", "--responses-store-max-mib", str(BOUND_MIB),
    )  # fmt: skip
    gateway = GatewayProcess(api_stack.model, [api_stack.worker.address], log, *flags)
    yield gateway.wait_ready()
    gateway.stop()


def metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", text, re.M)
    assert match, name
    return float(match[1])


def test_far_more_responses_than_fit_keep_the_bound_and_only_the_oldest_go(small_store, api_stack):
    client = openai.OpenAI(base_url=f"{small_store.base_url}/v1", api_key="x", max_retries=0)

    def create(n: int) -> str:
        reply = client.responses.create(
            model=str(api_stack.model),
            input=f"Request number {n}: say something.",
            max_output_tokens=2,
            temperature=0,
        )
        return reply.id

    with ThreadPoolExecutor(CLIENTS) as pool:
        first_wave = list(pool.map(create, range(CREATED // 2)))
    # The second wave is created after the first: every first-wave response is older.
    with ThreadPoolExecutor(CLIENTS) as pool:
        second_wave = list(pool.map(create, range(CREATED // 2, CREATED)))

    metrics = httpx.get(f"{small_store.base_url}/metrics", timeout=30).text
    held = metric(metrics, "mmgate_responses_store_bytes")
    entries = int(metric(metrics, "mmgate_responses_store_entries"))
    evicted = metric(metrics, 'mmgate_responses_store_evictions_total{reason="size"}')
    assert 0 < held <= BOUND_MIB * (1 << 20)
    assert 10 < entries < CREATED // 2  # far more were created than fit
    assert evicted == CREATED - entries

    # Nothing was read back, so the least recently used are the first created: those kept
    # are the newest, and every one of them comes back whole.
    kept = [rid for rid in first_wave + second_wave if _stored(client, rid)]
    assert len(kept) == entries
    # (Clients finish out of order: the last stored are the wave's last, give or take those
    # in flight at once.)
    assert set(kept) <= set(second_wave[-(entries + CLIENTS) :])
    newest = client.responses.retrieve(second_wave[-1])
    assert newest.status in ("completed", "incomplete") and newest.output


def _stored(client: openai.OpenAI, response_id: str) -> bool:
    try:
        client.responses.retrieve(response_id)
    except openai.NotFoundError:
        return False
    return True
