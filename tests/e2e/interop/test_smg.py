"""SMG 1.13.0 (the Rust router, from PyPI) driving our worker (issue 2, item 3)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from protos import vllm_engine_pb2 as pb
from tests.support.engines import free_port

MESSAGES = [{"role": "user", "content": "Write a haiku about the sea."}]


def smg_binary() -> str:
    found = shutil.which("smg", path=str(Path(sys.executable).parent)) or shutil.which("smg")
    if not found:
        pytest.fail("smg is not installed: scripts/install.sh --test installs smg==1.13.0")
    return found


@pytest.fixture(scope="module")
def smg(text_worker, tmp_path_factory) -> Iterator[str]:
    port, metrics = free_port(), free_port()
    log = open(tmp_path_factory.mktemp("smg") / "smg.log", "w+")  # noqa: SIM115
    cmd = [
        smg_binary(),
        "launch",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--worker-urls",
        f"grpc://{text_worker.address}",
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(metrics),
    ]
    proc = subprocess.Popen(cmd, stdout=log, stderr=log, env={**os.environ, "NO_COLOR": "1"})
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_for_model(proc, base, log)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()


def _wait_for_model(proc: subprocess.Popen, base: str, log) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            if httpx.get(f"{base}/v1/models", timeout=2).json().get("data"):
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.5)
    log.seek(0)
    pytest.fail(f"SMG did not register the worker:\n{log.read()[-4000:]}")


@pytest.fixture(scope="module")
def expected(text_worker, text_model):
    """What our worker generates for the chat-templated prompt, asked directly."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(text_model)
    ids = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    req = pb.GenerateRequest(
        request_id="direct",
        tokenized=pb.TokenizedInput(input_ids=ids),
        sampling_params=pb.SamplingParams(temperature=0.0, max_tokens=12),
    )
    (done,) = [r.complete for r in text_worker.stub().Generate(req)]
    return ids, list(done.output_ids), tokenizer.decode(done.output_ids, skip_special_tokens=True)


def client(base: str):
    from openai import OpenAI

    return OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=60)


def test_chat_completion_through_smg(smg, expected):
    ids, _, text = expected
    model = client(smg).models.list().data[0].id
    reply = client(smg).chat.completions.create(
        model=model, messages=MESSAGES, temperature=0, max_tokens=12
    )
    assert reply.usage.prompt_tokens == len(ids)
    assert reply.usage.completion_tokens == 12
    assert reply.choices[0].message.content == text
    assert reply.choices[0].finish_reason == "length"


def test_streaming_chat_completion_through_smg(smg, expected):
    _, _, text = expected
    model = client(smg).models.list().data[0].id
    stream = client(smg).chat.completions.create(
        model=model, messages=MESSAGES, temperature=0, max_tokens=12, stream=True
    )
    pieces, finish = [], None
    for chunk in stream:
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert "".join(pieces) == text
    assert finish == "length"
