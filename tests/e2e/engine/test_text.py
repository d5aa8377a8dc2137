"""Our worker on a tiny text model against vLLM's AsyncLLM called directly (issue 2, item 1)."""

from __future__ import annotations

import json
import math

import grpc
import pytest
from vllm import SamplingParams
from vllm.inputs.engine import tokens_input
from vllm.sampling_params import RequestOutputKind

from protos import vllm_engine_pb2 as pb

PROMPTS = [
    "def main():\n    return",
    "import os\nimport sys\n",
    "class Node:\n    def __init__(self",
]


@pytest.fixture(scope="module")
def tokenizer(text_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(text_model)


def greedy(max_tokens: int = 16, **fields) -> pb.SamplingParams:
    return pb.SamplingParams(temperature=0.0, max_tokens=max_tokens, **fields)


def request(ids, stream=False, **params) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=f"t-{id(ids)}-{stream}-{len(params)}",
        tokenized=pb.TokenizedInput(input_ids=ids),
        sampling_params=greedy(**params),
        stream=stream,
    )


def completes(responses) -> list[pb.GenerateComplete]:
    return [r.complete for r in responses if r.HasField("complete")]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_equals_asyncllm(text_worker, text_reference, tokenizer, prompt):
    ids = tokenizer.encode(prompt)
    (done,) = completes(text_worker.stub().Generate(request(ids)))
    ref = text_reference.generate(
        tokens_input(ids), SamplingParams(temperature=0.0, max_tokens=16), f"ref-{prompt}"
    )
    assert list(done.output_ids) == list(ref.outputs[0].token_ids)
    assert done.prompt_tokens == len(ids)
    assert done.completion_tokens == len(done.output_ids) == 16
    assert done.finish_reason == ref.outputs[0].finish_reason == "length"


def test_streaming_deltas_add_up_to_the_same_tokens(text_worker, tokenizer):
    ids = tokenizer.encode(PROMPTS[0])
    (whole,) = completes(text_worker.stub().Generate(request(ids)))
    responses = list(text_worker.stub().Generate(request(ids, stream=True)))
    chunks = [r.chunk for r in responses if r.HasField("chunk")]
    assert len(chunks) > 1, "streaming sends one chunk per engine step"
    streamed = [t for c in chunks for t in c.token_ids]
    assert streamed == list(whole.output_ids)
    assert all(c.completion_tokens == len(c.token_ids) for c in chunks)
    # The final Complete repeats the last delta: a client must not count it twice.
    (final,) = completes(responses)
    assert list(final.output_ids) == list(chunks[-1].token_ids)
    assert responses[-1].HasField("complete") and final.finish_reason == "length"


def test_text_input_is_tokenized_like_vllm(text_worker, text_reference):
    req = pb.GenerateRequest(request_id="text-1", text=PROMPTS[1], sampling_params=greedy())
    (done,) = completes(text_worker.stub().Generate(req))
    ref = text_reference.generate(PROMPTS[1], SamplingParams(temperature=0.0, max_tokens=16), "r1")
    assert done.prompt_tokens == len(ref.prompt_token_ids)
    assert list(done.output_ids) == list(ref.outputs[0].token_ids)


def sampled(ids, stream: bool, n: int = 2) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=f"sampled-{stream}-{n}",
        tokenized=pb.TokenizedInput(input_ids=ids),
        sampling_params=pb.SamplingParams(temperature=1.0, seed=7, n=n, max_tokens=12),
        stream=stream,
    )


def test_n2_streams_interleave_by_index(text_worker, text_reference, tokenizer):
    ids = tokenizer.encode(PROMPTS[2])
    responses = list(text_worker.stub().Generate(sampled(ids, stream=True)))
    per_index: dict[int, list[int]] = {0: [], 1: []}
    for r in responses:
        if r.HasField("chunk"):
            per_index[r.chunk.index] += list(r.chunk.token_ids)
    assert sorted(c.index for c in completes(responses)) == [0, 1]
    indices = [r.chunk.index for r in responses if r.HasField("chunk")]
    assert indices != sorted(indices), "the two samples' chunks interleave as they are decoded"
    whole = {
        c.index: list(c.output_ids)
        for c in completes(text_worker.stub().Generate(sampled(ids, stream=False)))
    }
    assert per_index == whole
    ref = text_reference.generate(
        tokens_input(ids),
        SamplingParams(
            temperature=1.0, seed=7, n=2, max_tokens=12, output_kind=RequestOutputKind.FINAL_ONLY
        ),
        "ref-n2",
    )
    assert whole == {o.index: list(o.token_ids) for o in ref.outputs}


def test_greedy_n2_is_refused_as_vllm_refuses_it(text_worker, tokenizer):
    with pytest.raises(grpc.RpcError) as err:
        completes(text_worker.stub().Generate(request(tokenizer.encode("x"), n=2)))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "greedy" in err.value.details()


def test_logprobs_equal_asyncllm(text_worker, text_reference, tokenizer):
    ids = tokenizer.encode(PROMPTS[0])
    (done,) = completes(text_worker.stub().Generate(request(ids, logprobs=3, prompt_logprobs=2)))
    ref = text_reference.generate(
        tokens_input(ids),
        SamplingParams(temperature=0.0, max_tokens=16, logprobs=3, prompt_logprobs=2),
        "ref-lp",
    ).outputs[0]
    lp = done.output_logprobs
    assert list(lp.token_ids) == list(done.output_ids)
    for pos, (tid, value, top) in enumerate(zip(lp.token_ids, lp.token_logprobs, lp.top_logprobs)):
        assert math.isclose(value, ref.logprobs[pos][tid].logprob, abs_tol=1e-4)
        assert len(top.token_ids) == 3 and top.token_ids[0] == tid  # greedy: rank 1
        # as smg-grpc-servicer: the entry's first items (sampled, then the top by rank)
        assert list(top.token_ids) == list(ref.logprobs[pos])[:3]
    prompt_lp = done.input_logprobs
    assert list(prompt_lp.token_ids) == ids
    assert not prompt_lp.token_logprobs[0].HasField("value")
    assert all(v.HasField("value") for v in prompt_lp.token_logprobs[1:])


def test_stop_string_is_matched_and_reported(text_worker, tokenizer):
    ids = tokenizer.encode(PROMPTS[0])
    (free,) = completes(text_worker.stub().Generate(request(ids, max_tokens=24)))
    text = tokenizer.decode(free.output_ids)
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert stop.strip(), f"pick a visible stop string from {text!r}"
    (done,) = completes(text_worker.stub().Generate(request(ids, max_tokens=24, stop=[stop])))
    assert done.finish_reason == "stop"
    assert done.matched_stop_str == stop
    assert len(done.output_ids) < len(free.output_ids)
    assert list(done.output_ids) == list(free.output_ids[: len(done.output_ids)])


def test_stop_token_id_is_reported(text_worker, tokenizer):
    ids = tokenizer.encode(PROMPTS[1])
    (free,) = completes(text_worker.stub().Generate(request(ids)))
    stop_id = free.output_ids[5]
    (done,) = completes(text_worker.stub().Generate(request(ids, stop_token_ids=[stop_id])))
    assert done.finish_reason == "stop" and done.matched_token_id == stop_id
    assert list(done.output_ids) == list(
        free.output_ids[: list(free.output_ids).index(stop_id) + 1]
    )


def test_json_schema_is_honoured(text_worker, tokenizer):
    schema = {
        "type": "object",
        "properties": {"answer": {"enum": ["yes", "no"]}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    ids = tokenizer.encode("Reply in JSON:")
    req = request(ids, max_tokens=64, json_schema=json.dumps(schema))
    (done,) = completes(text_worker.stub().Generate(req))
    assert done.finish_reason == "stop", "the grammar ends the object, then EOS"
    value = json.loads(tokenizer.decode(done.output_ids, skip_special_tokens=True))
    assert value in ({"answer": "yes"}, {"answer": "no"})


def test_choice_constraint(text_worker, tokenizer):
    ids = tokenizer.encode("Pick one:")
    choice = pb.ChoiceConstraint(choices=["alpha", "beta"])
    (done,) = completes(text_worker.stub().Generate(request(ids, choice=choice)))
    assert tokenizer.decode(done.output_ids, skip_special_tokens=True) in ("alpha", "beta")


def test_seeded_sampling_is_reproducible(text_worker, tokenizer):
    ids = tokenizer.encode(PROMPTS[0])
    params = dict(temperature=1.0, seed=42, max_tokens=12)
    runs = [
        completes(
            text_worker.stub().Generate(
                pb.GenerateRequest(
                    request_id=f"seed-{i}",
                    tokenized=pb.TokenizedInput(input_ids=ids),
                    sampling_params=pb.SamplingParams(**params),
                )
            )
        )[0].output_ids
        for i in range(2)
    ]
    assert list(runs[0]) == list(runs[1])


def test_bad_input_is_invalid_argument_and_server_survives(text_worker, tokenizer):
    stub = text_worker.stub()
    vocab = stub.GetModelInfo(pb.GetModelInfoRequest()).vocab_size
    with pytest.raises(grpc.RpcError) as err:
        completes(stub.Generate(request([1, 2, vocab + 5])))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "vocab" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        completes(stub.Generate(request(tokenizer.encode("x"), json_schema="{not json")))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert stub.HealthCheck(pb.HealthCheckRequest()).healthy
    (done,) = completes(stub.Generate(request(tokenizer.encode(PROMPTS[0]))))
    assert done.finish_reason == "length"


def test_logit_bias_and_min_tokens_reach_the_engine(text_worker, tokenizer):
    ids = tokenizer.encode(PROMPTS[0])
    (done,) = completes(
        text_worker.stub().Generate(request(ids, max_tokens=6, logit_bias={42: 100.0}))
    )
    assert list(done.output_ids) == [42] * 6
    (free,) = completes(text_worker.stub().Generate(request(ids)))
    first = free.output_ids[0]
    (early,) = completes(text_worker.stub().Generate(request(ids, stop_token_ids=[first])))
    assert len(early.output_ids) == 1
    (held,) = completes(
        text_worker.stub().Generate(request(ids, stop_token_ids=[first], min_tokens=5))
    )
    assert len(held.output_ids) >= 5
