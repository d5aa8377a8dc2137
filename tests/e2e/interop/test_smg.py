"""SMG 1.13.0 (the Rust router, from PyPI) driving our worker (issue 2, item 3)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from protos import vllm_engine_pb2 as pb
from tests.support.smg import run_smg, smg_client

MESSAGES = [{"role": "user", "content": "Write a haiku about the sea."}]


@pytest.fixture(scope="module")
def smg(text_worker, tmp_path_factory) -> Iterator[str]:
    with run_smg([text_worker.address], tmp_path_factory.mktemp("smg") / "smg.log") as base:
        yield base


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
    return smg_client(base)


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
