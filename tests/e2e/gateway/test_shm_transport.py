"""A video's tensors through /dev/shm to a real worker on this host (the tiny Qwen2-VL):

- with `--multimodal-tensor-transport auto` the segments appear in /dev/shm while the request
  waits on a frozen worker (and the gateway counts their bytes), the answer equals the one
  the same worker gives with the tensors inline, and no segment is left afterwards;
- a worker killed before it read its segments leaves none behind either: the gateway unlinks
  what it wrote when the call ends.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.support.engines import WorkerProcess
from tests.support.gateway_process import GatewayProcess
from tests.support.video_e2e import assert_same_answer, chat, data_uri, make_clip, text, video

SHM = Path("/dev/shm")
OURS = re.compile(r"mmgate-[0-9a-f]{32}")  # our segments' names (multimodal.shm)


def segments() -> set[str]:
    return {p.name for p in SHM.iterdir() if OURS.fullmatch(p.name)}


def wait_for(condition, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def shm_bytes(base_url: str) -> float:
    metrics = httpx.get(f"{base_url}/metrics", timeout=10).text
    found = re.search(r"^mmgate_shm_bytes_total (\S+)$", metrics, re.MULTILINE)
    assert found, "no mmgate_shm_bytes_total"
    return float(found.group(1))


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> str:
    # 5 s at 8 fps of 320x240: ten frames at vLLM's 2 fps, megabytes of patches
    tmp = tmp_path_factory.mktemp("clip")
    return data_uri(make_clip(tmp, "a.avi", 40, (320, 240), 8, "MJPG", 6), "video/x-msvideo")


@pytest.fixture(scope="module")
def other_clip(tmp_path_factory) -> str:
    # A clip the worker has not seen: one it holds (send-once: the first test sent `clip`)
    # would go as its hash alone, through no segment.
    tmp = tmp_path_factory.mktemp("other-clip")
    return data_uri(make_clip(tmp, "b.avi", 40, (320, 240), 8, "MJPG", 7), "video/x-msvideo")


@pytest.fixture(scope="module")
def worker(vision_model, tmp_path_factory):
    logs = tmp_path_factory.mktemp("shm-worker")
    engine = WorkerProcess(vision_model, logs / "worker.log", max_model_len=2048)
    try:
        yield engine.wait_ready()
    finally:
        engine.stop()


@pytest.fixture(scope="module")
def gateways(vision_model, worker, tmp_path_factory):
    logs = tmp_path_factory.mktemp("shm-gw")
    address = [worker.address]
    started = {
        mode: GatewayProcess(
            vision_model, address, logs / f"{mode}.log", "--multimodal-tensor-transport", mode
        )
        for mode in ("auto", "inline")
    }
    try:
        yield {mode: gateway.wait_ready() for mode, gateway in started.items()}
    finally:
        for gateway in started.values():
            gateway.stop()


def in_background(call) -> tuple[threading.Thread, list]:
    result: list = []
    thread = threading.Thread(target=lambda: result.append(call()), daemon=True)
    thread.start()
    return thread, result


def test_a_video_goes_through_dev_shm_and_equals_inline(clip, worker, gateways, vision_model):
    content = [video(clip), text("Describe.")]
    inline = chat(gateways["inline"].base_url, str(vision_model), content)
    assert shm_bytes(gateways["inline"].base_url) == 0
    before = segments()
    # Frozen, the worker cannot read (and unlink) the segments: we see them in /dev/shm.
    worker.freeze()
    try:
        thread, reply = in_background(
            lambda: chat(gateways["auto"].base_url, str(vision_model), content)
        )
        assert wait_for(lambda: segments() - before), "no segment appeared in /dev/shm"
        written = segments() - before
    finally:
        worker.thaw()
    thread.join(120)
    assert_same_answer(reply[0], inline)
    assert shm_bytes(gateways["auto"].base_url) > 1 << 20
    assert not (segments() & written), "segments left in /dev/shm"


def test_no_segment_outlives_a_worker_that_died_before_reading(
    other_clip, worker, gateways, vision_model
):
    """Last in this module: it kills the worker."""
    before = segments()
    worker.freeze()
    thread, reply = in_background(
        lambda: chat(gateways["auto"].base_url, str(vision_model), [video(other_clip)])
    )
    try:
        assert wait_for(lambda: segments() - before), "no segment appeared in /dev/shm"
        written = segments() - before
    finally:
        worker.kill()
    thread.join(120)
    assert reply[0].status_code >= 500, reply[0].text
    assert wait_for(lambda: not (segments() & written), 10), "segments left in /dev/shm"
