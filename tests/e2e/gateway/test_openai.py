"""The official openai SDK against `mmgate serve` in front of our worker on vLLM (issue 4)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.support.e2e_cases import MESSAGES, vllm_says
from tests.support.gateway_process import GatewayProcess, read_chat_stream


@pytest.fixture(scope="module")
def gateway(text_model, text_worker, tmp_path_factory):
    proc = GatewayProcess(
        text_model, [text_worker.address], tmp_path_factory.mktemp("gw") / "gateway.log"
    ).wait_ready()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def chat_ids(text_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(text_model)
    ids = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_chat_equals_vllm(gateway, text_reference, chat_ids):
    reply = gateway.client().chat.completions.create(
        model=gateway.client().models.list().data[0].id,
        messages=MESSAGES,
        temperature=0,
        max_tokens=16,
    )
    (want,) = vllm_says(text_reference, chat_ids, "gw-1", temperature=0, max_tokens=16)
    assert reply.choices[0].message.content == want.text
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.prompt_tokens == len(chat_ids)
    assert reply.usage.completion_tokens == 16


def test_kv_transfer_prompt_ids_are_the_prompt(gateway, text_reference, chat_ids):
    """A decode side handed the prefill side's prompt (`kv_transfer_params.prompt_token_ids`)
    generates from it, not from the messages, as vLLM's server does; the rest of the object
    reaches the real engine (which, without a KV connector, has nothing to return)."""
    prefill_ids = chat_ids[: len(chat_ids) // 2]
    params = {"prompt_token_ids": prefill_ids, "do_remote_prefill": False}
    reply = gateway.client().chat.completions.create(
        model=gateway.client().models.list().data[0].id,
        messages=MESSAGES,
        temperature=0,
        max_tokens=8,
        extra_body={"kv_transfer_params": params},
    )
    (want,) = vllm_says(text_reference, prefill_ids, "gw-kv", temperature=0, max_tokens=8)
    assert reply.choices[0].message.content == want.text
    assert reply.usage.prompt_tokens == len(prefill_ids)
    assert "kv_transfer_params" not in reply.model_dump()


def test_streaming_gives_the_same_text(gateway, text_reference, chat_ids):
    stream = gateway.client().chat.completions.create(
        model=None or gateway.client().models.list().data[0].id,
        messages=MESSAGES,
        temperature=0,
        max_tokens=16,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage, roles = read_chat_stream(stream)
    (want,) = vllm_says(text_reference, chat_ids, "gw-2", temperature=0, max_tokens=16)
    assert text == want.text
    assert roles[0] == "assistant" and finish == "length"
    assert usage.completion_tokens == 16 and usage.prompt_tokens == len(chat_ids)


def test_n2_stop_strings_and_seed(gateway, text_reference, chat_ids):
    client = gateway.client()
    model = client.models.list().data[0].id
    reply = client.chat.completions.create(
        model=model, messages=MESSAGES, n=2, seed=3, temperature=1.0, max_tokens=12
    )
    want = vllm_says(text_reference, chat_ids, "gw-3", n=2, seed=3, temperature=1.0, max_tokens=12)
    assert sorted(c.message.content for c in reply.choices) == sorted(o.text for o in want)
    free = reply.choices[0].message.content
    stop = free[4:6]
    stopped = client.chat.completions.create(
        model=model, messages=MESSAGES, n=1, seed=3, temperature=1.0, max_tokens=12, stop=[stop]
    )
    (want_stop,) = vllm_says(
        text_reference, chat_ids, "gw-4", seed=3, temperature=1.0, max_tokens=12, stop=[stop]
    )
    assert stopped.choices[0].message.content == want_stop.text
    assert stopped.choices[0].finish_reason == "stop"


def test_json_schema_response_format(gateway):
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    client = gateway.client()
    reply = client.chat.completions.create(
        model=client.models.list().data[0].id,
        messages=MESSAGES,
        max_tokens=40,
        response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": schema}},
    )
    assert json.loads(reply.choices[0].message.content) in ({"ok": True}, {"ok": False})


def vllm_chat_logprobs(output, top: int) -> list[dict]:
    """What vLLM's chat server builds from an output's Logprob entries (_create_chat_logprobs)."""

    def entry(token_id, logprob):
        name = logprob.decoded_token
        return {
            "token": name,
            "logprob": max(logprob.logprob, -9999.0),
            "bytes": list(name.encode("utf-8", errors="replace")),
        }

    return [
        {
            **entry(token_id, step[token_id]),
            "top_logprobs": [entry(t, lp) for t, lp in list(step.items())[:top]],
        }
        for token_id, step in zip(output.token_ids, output.logprobs)
    ]


def same_logprobs(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert (g["token"], g["bytes"]) == (w["token"], w["bytes"])
        assert g["logprob"] == pytest.approx(w["logprob"], abs=1e-4)
        assert [t["token"] for t in g["top_logprobs"]] == [t["token"] for t in w["top_logprobs"]]
        assert [t["bytes"] for t in g["top_logprobs"]] == [t["bytes"] for t in w["top_logprobs"]]


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs_equal_vllm(gateway, text_reference, chat_ids, stream):
    """Sampled (not greedy) so the sampled token is often outside the top list; 40 random
    tokens and top 8 bring byte-fallback pieces whose names vLLM corrects in context."""
    params = {"temperature": 1.0, "seed": 11, "max_tokens": 40}
    client = gateway.client()
    reply = client.chat.completions.create(
        model=client.models.list().data[0].id,
        messages=MESSAGES,
        logprobs=True,
        top_logprobs=8,
        stream=stream,
        extra_body={"ignore_eos": True},
        **params,
    )
    if stream:
        got = [
            c.model_dump()
            for chunk in reply
            if chunk.choices and chunk.choices[0].logprobs
            for c in chunk.choices[0].logprobs.content
        ]
    else:
        got = [c.model_dump() for c in reply.choices[0].logprobs.content]
    (want,) = vllm_says(
        text_reference, chat_ids, f"gw-lp-{stream}", logprobs=8, ignore_eos=True, **params
    )
    same_logprobs(got, vllm_chat_logprobs(want, 8))
    names = {t["token"] for c in got for t in c["top_logprobs"]}
    assert any("\ufffd" in n or n == "" for n in names) or any(not n.isascii() for n in names), (
        "no multi-byte pieces among the alternatives: the context rule went untested"
    )


def test_completion_logprobs_equal_vllm(gateway, text_reference):
    client = gateway.client()
    params = {"temperature": 0, "max_tokens": 12}
    reply = client.completions.create(
        model=client.models.list().data[0].id, prompt="def f(x):", logprobs=3, **params
    )
    (want,) = vllm_says(text_reference, "def f(x):", "gw-cmpl-lp", logprobs=3, **params)
    got = reply.choices[0].logprobs
    names = [step[t].decoded_token for t, step in zip(want.token_ids, want.logprobs)]
    assert got.tokens == names
    assert got.token_logprobs == pytest.approx(
        [step[t].logprob for t, step in zip(want.token_ids, want.logprobs)], abs=1e-4
    )
    assert got.text_offset == [sum(len(n) for n in names[:i]) for i in range(len(names))]
    # greedy: the sampled token is the top one, so vLLM's top+1 rule lists exactly 3
    assert [list(d) for d in got.top_logprobs] == [
        [lp.decoded_token for lp in step.values()] for step in want.logprobs
    ]
    assert "".join(got.tokens) == reply.choices[0].text


def test_errors_are_openai_shaped(gateway):
    client = gateway.client()
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=client.models.list().data[0].id,
            messages=[{"role": "user", "content": "x " * 3000}],
        )
    assert "maximum context length" in err.value.message
    reply = httpx.post(f"{gateway.base_url}/v1/chat/completions", content=b"{not json")
    assert reply.status_code == 400 and reply.json()["error"]["code"] == 400
    reply = httpx.post(
        f"{gateway.base_url}/v1/chat/completions", json={"messages": MESSAGES, "temperature": "hot"}
    )
    assert reply.status_code == 400 and reply.json()["error"]["param"]
    reply = httpx.post(f"{gateway.base_url}/v1/completions", content=b"")
    assert reply.status_code == 400 and "not valid JSON" in reply.json()["error"]["message"]
    reply = httpx.get(f"{gateway.base_url}/v1/chat/completions")
    assert reply.status_code == 405 and reply.headers["allow"] == "POST"
    assert reply.json()["error"]["code"] == 405


def test_a_body_sent_in_pieces(gateway):
    """A chunked upload arrives in several ASGI messages; the route joins them."""
    body = json.dumps({"messages": MESSAGES, "max_tokens": 2}).encode()
    pieces = (body[i : i + 7] for i in range(0, len(body), 7))
    reply = httpx.post(f"{gateway.base_url}/v1/chat/completions", content=pieces)
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] == 2


def test_completions_equal_vllm(gateway, text_reference):
    client = gateway.client()
    model = client.models.list().data[0].id
    prompts = ["def f(x):", "import sys\n"]
    reply = client.completions.create(model=model, prompt=prompts, max_tokens=10, temperature=0)
    want = [
        vllm_says(text_reference, p, f"cmpl-{i}", max_tokens=10, temperature=0)[0].text
        for i, p in enumerate(prompts)
    ]
    assert [c.text for c in sorted(reply.choices, key=lambda c: c.index)] == want
    assert reply.usage.completion_tokens == 20
    streamed = client.completions.create(
        model=model, prompt=prompts[0], max_tokens=10, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == want[0]


def test_completions_with_token_ids_and_echo(gateway, text_model):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(text_model / "tokenizer.json"))
    client = gateway.client()
    model = client.models.list().data[0].id
    ids = tokenizer.encode("class A:").ids
    by_ids = client.completions.create(model=model, prompt=ids, max_tokens=6, temperature=0)
    by_text = client.completions.create(
        model=model, prompt="class A:", max_tokens=6, temperature=0, echo=True
    )
    assert by_text.choices[0].text == "class A:" + by_ids.choices[0].text
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=model, prompt="x", suffix="y")
    assert "suffix" in err.value.message


def test_model_files_from_the_worker_when_no_local_copy(
    text_worker, tmp_path, text_reference, monkeypatch
):
    """--model NAME with no local directory: tokenizer and template come from GetTokenizer."""
    monkeypatch.setenv("MMGATE_CACHE", str(tmp_path / "cache"))
    proc = GatewayProcess("org/not-a-local-dir", [text_worker.address], tmp_path / "gateway.log")
    try:
        proc.wait_ready()
        client = proc.client()
        assert client.models.list().data[0].id == "org/not-a-local-dir"
        reply = client.chat.completions.create(
            model="org/not-a-local-dir", messages=MESSAGES, temperature=0, max_tokens=16
        )
        from transformers import AutoTokenizer

        bundle_dirs = list((tmp_path / "cache" / "bundles").iterdir())
        assert len(bundle_dirs) == 1 and (bundle_dirs[0] / "tokenizer.json").is_file()
        tokenizer = AutoTokenizer.from_pretrained(bundle_dirs[0])
        ids = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        (want,) = vllm_says(text_reference, ids, "gw-bundle", temperature=0, max_tokens=16)
        assert reply.choices[0].message.content == want.text
        assert reply.usage.prompt_tokens == len(ids)
    finally:
        proc.stop()


def test_client_disconnect_aborts_the_engine_request(gateway, text_worker):
    """Closing a stream mid-way cancels the gRPC call and the engine frees the request."""
    import time

    from protos import vllm_engine_pb2 as pb

    stub = text_worker.stub()

    def running() -> int:
        return stub.GetLoads(pb.GetLoadsRequest()).loads[0].num_total_reqs

    body = {
        "messages": MESSAGES,
        "max_tokens": 990,  # ~3 s or more of generation on this tiny model
        "stream": True,
        "ignore_eos": True,
    }
    with httpx.stream(
        "POST", f"{gateway.base_url}/v1/chat/completions", json=body, timeout=60
    ) as reply:
        events = (line for line in reply.iter_lines() if line.startswith("data: "))
        next(events)  # the role chunk, sent before the worker is called
        next(events)  # the first content: the engine is generating
        assert running() == 1
    # freed well before the generation could have ended by itself
    deadline = time.monotonic() + 1.5
    while running() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert running() == 0


def test_truncate_prompt_tokens_as_vllm(gateway, text_reference, text_model):
    """The gateway truncates (vLLM keeps the last ids for generation; -1 leaves room for one
    output token), so workers that ignore the field for token prompts still get it right."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(text_model / "tokenizer.json"))
    client = gateway.client()
    model = client.models.list().data[0].id
    prompt = "import os\nimport sys\ndef main(argv):"
    reply = client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=6,
        temperature=0,
        extra_body={"truncate_prompt_tokens": 5},
    )
    last5 = tokenizer.encode(prompt).ids[-5:]
    (want,) = vllm_says(text_reference, last5, "gw-trunc", max_tokens=6, temperature=0)
    assert reply.choices[0].text == want.text
    assert reply.usage.prompt_tokens == 5
    long = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "x " * 3000}],
        extra_body={"truncate_prompt_tokens": -1},
    )
    assert long.usage.prompt_tokens == 1023 and long.usage.completion_tokens == 1
    with pytest.raises(openai.BadRequestError):
        client.completions.create(
            model=model, prompt="x", extra_body={"truncate_prompt_tokens": 5000}
        )
