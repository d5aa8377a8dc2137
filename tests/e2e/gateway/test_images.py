"""Image chat through `mmgate serve` (openai SDK) equals vLLM's own image path."""

from __future__ import annotations

import base64
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx
import openai
import pytest

from tests.support.e2e_cases import IMAGE, MM_LIMITS, QWEN2VL_CONTEXT, ask, make_image, png_bytes
from tests.support.gateway_process import GatewayProcess
from tests.support.http_files import serve_bytes


@pytest.fixture(scope="module")
def image_server():
    with serve_bytes(png_bytes(IMAGE)) as base:
        yield f"{base}/cat.png"


@pytest.fixture(scope="module")
def worker(qwen2vl_worker):
    """The session's plain Qwen2-VL worker (tests/e2e/gateway/conftest.py)."""
    return qwen2vl_worker


def gateway_for(vision_model, worker, tmp_path_factory, *extra):
    log = tmp_path_factory.mktemp("gwv") / "gateway.log"
    return GatewayProcess(vision_model, [worker.address], log, *extra).wait_ready()


@pytest.fixture(scope="module")
def expected(qwen2vl_pair) -> str:
    """vLLM's own server's greedy answer to the image."""
    data_uri = "data:image/png;base64," + base64.b64encode(png_bytes(IMAGE)).decode()
    return ask(qwen2vl_pair.vllm, data_uri).choices[0].message.content


def test_data_uri_and_allow_listed_url_equal_vllm(
    vision_model, worker, image_server, expected, tmp_path_factory
):
    gateway = gateway_for(
        vision_model, worker, tmp_path_factory, "--allow-private-media-networks", "127.0.0.0/8"
    )
    try:
        data_uri = "data:image/png;base64," + base64.b64encode(png_bytes(IMAGE)).decode()
        assert ask(gateway, data_uri).choices[0].message.content == expected
        assert ask(gateway, image_server).choices[0].message.content == expected
    finally:
        gateway.stop()


def _metric(gateway, name: str) -> float:
    for line in httpx.get(f"{gateway.base_url}/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not on /metrics")


def test_a_resent_image_hits_the_media_cache_and_still_equals_vllm(
    vision_model, worker, expected, tmp_path_factory
):
    """The second turn's image comes from the cache (not decoded, not preprocessed): the same
    text as vLLM's; with the cache off, none is kept."""
    data_uri = "data:image/png;base64," + base64.b64encode(png_bytes(IMAGE)).decode()
    for flags, hits in (((), 2), (("--mm-processor-cache-gb", "0"), 0)):
        gateway = gateway_for(vision_model, worker, tmp_path_factory, *flags)
        try:
            for _ in range(3):
                assert ask(gateway, data_uri).choices[0].message.content == expected
            assert _metric(gateway, "mmgate_mm_cache_hits_total") == hits
            assert _metric(gateway, "mmgate_mm_cache_misses_total") == (1 if hits else 0)
            assert (_metric(gateway, "mmgate_mm_cache_bytes") > 0) == bool(hits)
        finally:
            gateway.stop()


def test_images_through_the_grpcio_client_equal_vllm(
    vision_model, worker, expected, tmp_path_factory
):
    # The request goes out pre-serialized here too (a raw Generate call with the pixels appended).
    gateway = gateway_for(vision_model, worker, tmp_path_factory, "--stream-client", "grpcio")
    try:
        data_uri = "data:image/png;base64," + base64.b64encode(png_bytes(IMAGE)).decode()
        assert ask(gateway, data_uri).choices[0].message.content == expected
    finally:
        gateway.stop()


def test_private_urls_are_refused_by_default(vision_model, worker, image_server, tmp_path_factory):
    gateway = gateway_for(vision_model, worker, tmp_path_factory)
    try:
        with pytest.raises(openai.BadRequestError) as err:
            ask(gateway, image_server)
        assert "image 0" in err.value.message
        with pytest.raises(openai.BadRequestError):
            ask(gateway, "data:image/png;base64,not-an-image")
        # Several images: the one that fails is named by its position.
        good = "data:image/png;base64," + base64.b64encode(png_bytes(IMAGE)).decode()
        corrupt = "data:image/png;base64," + base64.b64encode(png_bytes(IMAGE)[:200]).decode()
        with pytest.raises(openai.BadRequestError) as err:
            ask(gateway, good, corrupt)
        assert "image 1: corrupt or truncated image" in err.value.message
    finally:
        gateway.stop()


def test_bad_processor_options_are_400s_naming_the_key(vision_model, worker, tmp_path_factory):
    """mm_processor_kwargs are checked against the family's typed options before any work."""
    data_uri = "data:image/png;base64," + base64.b64encode(png_bytes(IMAGE)).decode()
    content = [{"type": "image_url", "image_url": {"url": data_uri}}, {"type": "text", "text": "?"}]
    cases = {
        "max_pixels": "mm_processor_kwargs.max_pixels must be a positive integer",
        "size": "mm_processor_kwargs.size.longest_edge must be a positive integer",
        "resample": "unsupported mm_processor_kwargs ['resample'] for Qwen-VL (accepted: "
        "min_pixels, max_pixels, size)",
    }
    values = {"max_pixels": "many", "size": {"longest_edge": 0}, "resample": 3}
    gateway = gateway_for(vision_model, worker, tmp_path_factory)
    try:
        for key, message in cases.items():
            body = {
                "messages": [{"role": "user", "content": content}],
                "max_tokens": 2,
                "mm_processor_kwargs": {key: values[key]},
            }
            reply = httpx.post(f"{gateway.base_url}/v1/chat/completions", json=body, timeout=60)
            assert reply.status_code == 400, reply.text
            error = reply.json()["error"]
            assert (error["message"], error["param"]) == (message, "mm_processor_kwargs")
    finally:
        gateway.stop()


def test_tokenize_with_images_equals_vllm(vision_model, worker, tmp_path_factory):
    """/tokenize expands each image into its placeholder tokens exactly as vLLM's does."""
    from tests.support.vllm_tokenize import VllmTokenization

    wide = make_image(300, 90, seed=5)
    uris = [
        "data:image/png;base64," + base64.b64encode(png_bytes(image)).decode()
        for image in (IMAGE, wide)
    ]
    content = [
        {"type": "image_url", "image_url": {"url": uris[0]}},
        {"type": "text", "text": "and"},
        {"type": "image_url", "image_url": {"url": uris[1]}},
    ]
    body = {"messages": [{"role": "user", "content": content}], "return_token_strs": True}
    reference = VllmTokenization(
        vision_model, max_model_len=QWEN2VL_CONTEXT, limit_mm_per_prompt=MM_LIMITS
    )
    want = reference.tokenize(body)
    gateway = gateway_for(vision_model, worker, tmp_path_factory)
    try:
        got = httpx.post(f"{gateway.base_url}/tokenize", json=body, timeout=60)
        assert got.status_code == 200, got.text
        assert got.json() == want
        assert want["tokens"].count(3005) > 20  # the images really were expanded
    finally:
        gateway.stop()


def test_admission_counts_the_image_download_against_the_limit(
    vision_model, worker, tmp_path_factory
):
    """Admission with the real vision worker: a request whose image host answers slowly holds
    the only slot while its image downloads, the next request waits in the queue until its
    timeout (503), one more is refused at once (429), and the slow one still succeeds."""
    limits = ["--max-in-flight", "1", "--max-queue", "1", "--queue-timeout", "2"]
    with serve_bytes(png_bytes(IMAGE), delay=6.0) as slow_host:
        gateway = gateway_for(
            vision_model, worker, tmp_path_factory,
            "--allow-private-media-networks", "127.0.0.0/8", *limits,
        )  # fmt: skip
        try:
            with ThreadPoolExecutor(2) as pool:
                slow = pool.submit(post_chat, gateway, f"{slow_host}/cat.png")
                wait_for_metric(gateway, "mmgate_admitted_requests 1.0")
                queued = pool.submit(post_chat, gateway)
                wait_for_metric(gateway, "mmgate_queue_depth 1.0")
                refused = post_chat(gateway)
                assert refused.status_code == 429, refused.text
                assert queued.result(timeout=30).status_code == 503
                done = slow.result(timeout=60)
            assert done.status_code == 200, done.text
            assert done.json()["choices"][0]["finish_reason"] == "length"
        finally:
            gateway.stop()


def post_chat(gateway, image_url: str | None = None):
    content = [{"type": "text", "text": "Describe."}]
    if image_url:
        content.insert(0, {"type": "image_url", "image_url": {"url": image_url}})
    body = {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 4,
        "temperature": 0,
        "ignore_eos": True,  # the random model may pick EOS; "length" must not depend on it
    }
    return httpx.post(f"{gateway.base_url}/v1/chat/completions", json=body, timeout=60)


def wait_for_metric(gateway, line: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while line not in httpx.get(f"{gateway.base_url}/metrics", timeout=10).text:
        assert time.monotonic() < deadline, f"never saw {line!r}"
        time.sleep(0.05)


def test_worker_side_processing_needs_a_worker_that_offers_it(
    vision_model, worker, tmp_path_factory
):
    """This worker was not started with --mm-processor: it refuses media_refs, and a gateway
    told to leave preprocessing to the workers says what to change."""
    from protos import common_pb2
    from protos import vllm_engine_pb2 as pb

    info = worker.stub().GetServerInfo(pb.GetServerInfoRequest(), timeout=10)
    assert (info.mm_processor, info.mm_media_ref_schemes) == ("", "")
    refs = pb.MediaRefs(items=[pb.MediaRef(modality=common_pb2.IMAGE, url="data:,x")])
    request = pb.GenerateRequest(tokenized=pb.TokenizedInput(input_ids=[1, 2]), media_refs=refs)
    with pytest.raises(grpc.RpcError) as refused:
        list(worker.stub().Generate(request, timeout=30))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "--mm-processor inprocess" in refused.value.details()
    gateway = gateway_for(vision_model, worker, tmp_path_factory, "--mm-processing", "worker")
    try:
        data_uri = "data:image/png;base64," + base64.b64encode(png_bytes(IMAGE)).decode()
        with pytest.raises(openai.BadRequestError, match="start the workers with --mm-processor"):
            ask(gateway, data_uri)
    finally:
        gateway.stop()
