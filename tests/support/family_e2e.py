"""The end-to-end check every model family passes: the same image chats sent to vLLM's own
OpenAI server (its HF processor in process) and to `mmgate serve` -> `mmgate engine` on the
same tiny random-weight model give the same prompt token counts and the same greedy text.

A family's test module builds its model, starts both with `serve_both` (a module-scoped
fixture), and compares `answers(...)` of the two for `CASES`.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.e2e_cases import IMAGE, make_image, png_bytes
from tests.support.engines import UpstreamServicerProcess, VllmServerProcess, WorkerProcess
from tests.support.gateway_process import GatewayProcess

# (name, images): one image, two of different sizes, a very wide one with a tiny one.
CASES: list[tuple[str, list[Any]]] = [
    ("one", [IMAGE]),
    ("two-sizes", [IMAGE, make_image(640, 480, seed=3)]),
    ("wide-and-tiny", [make_image(1200, 60, seed=4), make_image(9, 7, seed=5)]),
]
REFERENCE_NAME = "tiny"  # the model name vLLM's server answers to (VllmServerProcess)


def data_uri(image: Any) -> str:
    return "data:image/png;base64," + base64.b64encode(png_bytes(image)).decode()


def messages(images: Sequence[Any], text: str = "Describe.") -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": data_uri(i)}} for i in images]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


def ask(client: Any, images: Sequence[Any], model: str, **extra: Any) -> Any:
    """A greedy chat of 10 tokens (EOS ignored, so the length never depends on it)."""
    return client.chat.completions.create(
        model=model,
        messages=messages(images),
        temperature=0,
        max_tokens=10,
        extra_body={"ignore_eos": True, **extra.pop("extra_body", {})},
        **extra,
    )


def answers(
    client: Any, model: str, cases: Sequence[tuple[str, list[Any]]] = CASES
) -> dict[str, tuple[int, str]]:
    """(prompt_tokens, text) per case."""
    replies = {name: ask(client, images, model) for name, images in cases}
    return {
        name: (reply.usage.prompt_tokens, reply.choices[0].message.content)
        for name, reply in replies.items()
    }


@dataclass
class Pair:
    """vLLM's server and our gateway in front of our worker, on one model."""

    vllm: VllmServerProcess
    worker: WorkerProcess
    gateway: GatewayProcess
    model: Path

    def reference(self, cases: Sequence[tuple[str, list[Any]]] = CASES) -> dict:
        return answers(self.vllm.client(), REFERENCE_NAME, cases)

    def ours(self, cases: Sequence[tuple[str, list[Any]]] = CASES) -> dict:
        return answers(self.gateway.client(), str(self.model), cases)


@contextmanager
def serve_both(
    model: Path, logs: Path, *gateway_args: str, worker_extra: dict | None = None, **engine: Any
) -> Iterator[Pair]:
    """Both engines started at once with the same engine arguments (`engine`, e.g.
    limit_mm_per_prompt, max_model_len, dtype); `worker_extra` only for ours."""
    vllm = VllmServerProcess(model, logs / "vllm.log", **engine)
    worker = WorkerProcess(model, logs / "worker.log", **engine, **(worker_extra or {}))
    gateway = None
    try:
        vllm.wait_ready()
        worker.wait_ready()
        gateway = GatewayProcess(model, [worker.address], logs / "gateway.log", *gateway_args)
        yield Pair(vllm, worker, gateway.wait_ready(), model)
    finally:
        if gateway is not None:
            gateway.stop()
        worker.stop()
        vllm.stop()


@contextmanager
def media_ref_engines(model: Path, logs: Path, **engine: Any) -> Iterator[dict[str, Any]]:
    """vLLM's server ("vllm"), our worker ("ours") and the upstream servicer ("upstream"),
    both workers preprocessing media themselves (`--mm-processor inprocess`), started at once
    with the same engine arguments and stopped together."""
    started = {
        "vllm": VllmServerProcess(model, logs / "vllm.log", **engine),
        "ours": WorkerProcess(model, logs / "ours.log", mm_processor="inprocess", **engine),
        "upstream": UpstreamServicerProcess(
            model, logs / "upstream.log", mm_processor="inprocess", **engine
        ),
    }
    try:
        yield {name: process.wait_ready() for name, process in started.items()}
    finally:
        for process in started.values():
            process.stop()


def vllm_prompt_ids(model: Path, images: Sequence[Any], options: dict, **config: Any) -> list[int]:
    """The prompt ids vLLM's own processor for the model makes of `messages(images)` with
    these mm_processor_kwargs, run offline: vLLM's server takes per-request kwargs only with
    --trust-request-mm-kwargs, a server flag our worker does not share. `config`: more of
    vLLM's ModelConfig (e.g. max_model_len)."""
    from transformers import AutoTokenizer
    from vllm.config import ModelConfig
    from vllm.multimodal import MULTIMODAL_REGISTRY
    from vllm.multimodal.processing.context import TimingContext
    from vllm.multimodal.processing.inputs import ProcessorInputs

    processor = MULTIMODAL_REGISTRY.create_processor(ModelConfig(model=str(model), **config))
    tokenizer = AutoTokenizer.from_pretrained(model)
    content = [{"type": "image"}] * len(images) + [{"type": "text", "text": "Describe."}]
    chat = [{"role": "user", "content": content}]  # as messages(), parts typed
    text = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    items = processor.info.parse_mm_data({"image": list(images)})
    inputs = ProcessorInputs(ids, items, hf_processor_mm_kwargs=options)
    return processor.apply(inputs, TimingContext(enabled=False))["prompt_token_ids"]


def short_placeholder_request(model: Path, worker: WorkerProcess, image: Any) -> Any:
    """One image preprocessed by the gateway's code for `worker`'s pixel encoding, with one
    embedding token taken out of its placeholder (the ids and the range both one shorter):
    the worker's slot check must refuse it before the engine core sees it."""
    from gateway.render.model_files import ModelFiles
    from gateway.render.renderer import ChatRenderer
    from multimodal.media import MediaPolicy, decode_source
    from multimodal.pipeline import PixelEncoding, prepare
    from multimodal.registry import processors_for
    from protos import vllm_engine_pb2 as pb

    files = ModelFiles.load(model)
    processors = processors_for(files)
    rendered = ChatRenderer(files, processors.placeholders).render(messages([image]))
    info = worker.stub().GetServerInfo(pb.GetServerInfoRequest(), timeout=10)
    encoding = PixelEncoding.for_engine(info.mm_device_do_normalize, info.multimodal_encoder_dtype)
    processor = processors.get("image")
    loaded = decode_source(data_uri(image), None, MediaPolicy())
    prepared = prepare([(processor, [loaded])], rendered.token_ids, {}, encoding)
    return shortened_request(prepared, processor.anchor_token_id, "short-placeholder")


def shortened_request(prepared: Any, anchor_token_id: int, request_id: str) -> Any:
    """A GenerateRequest of `prepared`'s one item with one embedding token taken out of its
    placeholder (the ids and the range both one shorter)."""
    from protos import vllm_engine_pb2 as pb

    (mm,) = prepared.mm_inputs
    ids = list(prepared.prompt_ids)
    embed = mm.im_token_id if mm.HasField("im_token_id") else anchor_token_id
    placeholder = mm.mm_placeholders[0]
    del ids[ids.index(embed, placeholder.offset)]
    placeholder.length -= 1
    return pb.GenerateRequest(
        request_id=request_id,
        tokenized=pb.TokenizedInput(input_ids=ids),
        mm_inputs=mm,
        sampling_params=pb.SamplingParams(temperature=0.0, max_tokens=2),
    )


def assert_slot_check_refuses(pair: Pair, image: Any = IMAGE) -> None:
    """The worker refuses a placeholder one embedding short with INVALID_ARGUMENT and keeps
    serving."""
    import grpc
    import pytest

    from protos import vllm_engine_pb2 as pb

    request = short_placeholder_request(pair.model, pair.worker, image)
    with pytest.raises(grpc.RpcError) as refused:
        list(pair.worker.stub().Generate(request, timeout=60))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value.details()
    assert "embedding positions" in refused.value.details()
    assert pair.worker.stub().HealthCheck(pb.HealthCheckRequest(), timeout=10).healthy
