"""Media the worker preprocesses (`media_refs`): `mmgate engine --mm-processor inprocess` runs
vLLM's own processor on what the gateway fetched and checked, and answers as the gateway's own
preprocessing does, on the tiny Qwen2-VL; the same worker still takes preprocessed tensors."""

from __future__ import annotations

import base64

import grpc
import httpx
import openai
import pytest

from protos import common_pb2
from protos import vllm_engine_pb2 as pb
from tests.support.e2e_cases import IMAGE, ask, chat_prompt, make_image, png_bytes
from tests.support.gateway_process import GatewayProcess, read_chat_stream
from tests.support.http_files import serve_bytes

WIDE = make_image(300, 90, seed=5)


def data_uri(image) -> str:
    return "data:image/png;base64," + base64.b64encode(png_bytes(image)).decode()


@pytest.fixture(scope="module")
def worker(qwen2vl_pair):
    """The session's `mmgate engine --mm-processor inprocess` (tests/e2e/gateway/conftest.py)."""
    return qwen2vl_pair.ours


@pytest.fixture(scope="module")
def gateways(vision_model, worker, tmp_path_factory):
    """Two gateways on the one worker: one that preprocesses (Qwen2-VL has a file here), one
    that leaves it to the worker."""
    logs = tmp_path_factory.mktemp("gw-media")
    private = ("--allow-private-media-networks", "127.0.0.0/8")
    started = {
        mode: GatewayProcess(
            vision_model, [worker.address], logs / f"{mode}.log", "--mm-processing", mode, *private
        )
        for mode in ("gateway", "worker")
    }
    try:
        yield {mode: gateway.wait_ready() for mode, gateway in started.items()}
    finally:
        for gateway in started.values():
            gateway.stop()


@pytest.fixture(scope="module")
def expected(qwen2vl_pair):
    """vLLM's own server's answers to one image and to two of different sizes."""
    return {
        count: ask(qwen2vl_pair.vllm, *(data_uri(image) for image in images))
        for count, images in ((1, [IMAGE]), (2, [IMAGE, WIDE]))
    }


def test_the_worker_advertises_media_refs(worker, gateways):
    info = worker.stub().GetServerInfo(pb.GetServerInfoRequest(), timeout=10)
    assert (info.mm_processor, info.mm_media_ref_schemes, info.mm_processor_source) == (
        "inprocess",
        "http,https,data",
        "flag",
    )
    listed = httpx.get(f"{gateways['worker'].base_url}/admin/workers", timeout=10).json()
    assert [w["media_ref_schemes"] for w in listed["workers"]] == [["data", "http", "https"]]


@pytest.mark.parametrize("images", [[IMAGE], [IMAGE, WIDE]], ids=["one", "two-sizes"])
def test_worker_side_processing_equals_vllm_and_the_gateway_s_own(gateways, expected, images):
    want = expected[len(images)]
    urls = [data_uri(image) for image in images]
    for mode, gateway in gateways.items():
        reply = ask(gateway, *urls)
        assert reply.choices[0].message.content == want.choices[0].message.content, mode
        assert reply.usage.prompt_tokens == want.usage.prompt_tokens, mode


def test_a_streamed_answer_counts_the_prompt_the_worker_expanded(gateways, expected):
    client = gateways["worker"].client()
    content = [
        {"type": "image_url", "image_url": {"url": data_uri(IMAGE)}},
        {"type": "text", "text": "Describe."},
    ]
    stream = client.chat.completions.create(
        model=client.models.list().data[0].id,
        messages=[{"role": "user", "content": content}],
        temperature=0,
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    text, finish, usage, _ = read_chat_stream(stream)
    assert (text, finish) == (expected[1].choices[0].message.content, "length")
    assert usage.prompt_tokens == expected[1].usage.prompt_tokens


def test_the_gateway_fetches_and_checks_before_forwarding(
    gateways, vision_model, worker, tmp_path_factory
):
    with serve_bytes(png_bytes(IMAGE)) as host:
        # allowed by the operator: fetched by the gateway, forwarded inline
        reply = ask(gateways["worker"], f"{host}/cat.png")
        assert reply.choices[0].message.content
        strict = GatewayProcess(
            vision_model,
            [worker.address],
            tmp_path_factory.mktemp("gw-strict") / "gateway.log",
            "--mm-processing",
            "worker",
        ).wait_ready()
        try:
            with pytest.raises(openai.BadRequestError, match="image 0: .*loopback"):
                ask(strict, f"{host}/cat.png")
        finally:
            strict.stop()
    corrupt = "data:image/png;base64," + base64.b64encode(b"not an image").decode()
    with pytest.raises(openai.BadRequestError, match="image 1: not a supported image"):
        ask(gateways["worker"], data_uri(IMAGE), corrupt)


def test_processor_kwargs_cannot_reach_a_preprocessing_worker(gateways):
    client = gateways["worker"].client()
    content = [{"type": "image_url", "image_url": {"url": data_uri(IMAGE)}}]
    with pytest.raises(openai.BadRequestError, match="mm_processor_kwargs cannot reach"):
        client.chat.completions.create(
            model=client.models.list().data[0].id,
            messages=[{"role": "user", "content": content}],
            max_tokens=2,
            extra_body={"mm_processor_kwargs": {"max_pixels": 50000}},
        )


def generate_with_refs(worker, ids, *urls):
    refs = pb.MediaRefs(items=[pb.MediaRef(modality=common_pb2.IMAGE, url=u) for u in urls])
    request = pb.GenerateRequest(
        request_id="refs",
        tokenized=pb.TokenizedInput(input_ids=ids),
        sampling_params=pb.SamplingParams(max_tokens=2, temperature=0.0),
        media_refs=refs,
    )
    return list(worker.stub().Generate(request, timeout=60))


def test_bad_references_are_invalid_arguments(worker, vision_model):
    from transformers import AutoProcessor

    tokenizer = AutoProcessor.from_pretrained(vision_model).tokenizer
    ids = tokenizer(chat_prompt(AutoProcessor.from_pretrained(vision_model), [IMAGE]))["input_ids"]
    cases = {
        "file:///etc/passwd": "scheme 'file' is not accepted",
        "data:image/png;base64,aGVsbG8=": "media_refs[0]",
    }
    for url, message in cases.items():
        with pytest.raises(grpc.RpcError) as refused:
            generate_with_refs(worker, ids, url)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value.details()
        assert message in refused.value.details()
    # one placeholder, two images: vLLM's own placeholder check refuses it
    with pytest.raises(grpc.RpcError) as refused:
        generate_with_refs(worker, ids, data_uri(IMAGE), data_uri(WIDE))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert generate_with_refs(worker, ids, data_uri(IMAGE))[-1].HasField("complete")
