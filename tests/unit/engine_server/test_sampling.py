"""Every SamplingParams field of the proto lands on vLLM's SamplingParams (no engine needed)."""

from __future__ import annotations

import json

import grpc
import pytest
from vllm.sampling_params import RequestOutputKind

from engine_server.errors import InvalidRequest, status_for
from engine_server.sampling import kv_transfer_params_from_request, sampling_params_from_proto
from protos import vllm_engine_pb2 as pb


def test_every_field_is_mapped():
    proto = pb.SamplingParams(
        temperature=0.7,
        top_p=0.9,
        top_k=40,
        min_p=0.05,
        frequency_penalty=0.5,
        presence_penalty=0.25,
        repetition_penalty=1.1,
        max_tokens=33,
        min_tokens=3,
        stop=["\n\n"],
        stop_token_ids=[7, 8],
        skip_special_tokens=True,
        spaces_between_special_tokens=True,
        ignore_eos=True,
        n=3,
        logprobs=4,
        prompt_logprobs=2,
        seed=11,
        include_stop_str_in_output=True,
        logit_bias={5: -100.0},
        regex="[a-z]+",
    )
    params = sampling_params_from_proto(proto, stream=True, kv_transfer_params={"a": 1})
    expected = dict(
        temperature=pytest.approx(0.7),
        top_p=pytest.approx(0.9),
        top_k=40,
        min_p=pytest.approx(0.05),
        frequency_penalty=0.5,
        presence_penalty=0.25,
        repetition_penalty=pytest.approx(1.1),
        max_tokens=33,
        min_tokens=3,
        stop=["\n\n"],
        stop_token_ids=[7, 8],
        skip_special_tokens=True,
        spaces_between_special_tokens=True,
        ignore_eos=True,
        n=3,
        logprobs=4,
        prompt_logprobs=2,
        seed=11,
        include_stop_str_in_output=True,
        logit_bias={5: -100.0},
        detokenize=True,
        output_kind=RequestOutputKind.DELTA,
        extra_args={"kv_transfer_params": {"a": 1}},
    )
    assert {k: getattr(params, k) for k in expected} == expected
    assert params.structured_outputs.regex == "[a-z]+"


def test_proto3_zero_values_mean_vllm_defaults():
    params = sampling_params_from_proto(pb.SamplingParams(), stream=False)
    assert (params.temperature, params.top_p, params.repetition_penalty, params.n) == (1, 1, 1, 1)
    assert params.max_tokens is None and params.seed is None and params.logprobs is None
    assert params.output_kind == RequestOutputKind.FINAL_ONLY
    assert params.detokenize is False and params.structured_outputs is None


@pytest.mark.parametrize(
    "field, value, attribute",
    [
        ("json_schema", json.dumps({"type": "object"}), "json"),
        ("grammar", 'root ::= "a"', "grammar"),
        ("structural_tag", '{"type": "structural_tag"}', "structural_tag"),
        ("json_object", True, "json_object"),
    ],
)
def test_each_structured_output_constraint(field, value, attribute):
    params = sampling_params_from_proto(pb.SamplingParams(**{field: value}), stream=False)
    assert getattr(params.structured_outputs, attribute) == value
    choice = pb.SamplingParams(choice=pb.ChoiceConstraint(choices=["a", "b"]))
    assert sampling_params_from_proto(choice, stream=False).structured_outputs.choice == ["a", "b"]


def test_refusals_are_invalid_argument():
    for bad in (pb.SamplingParams(temperature=-1.0), pb.SamplingParams(json_schema="{")):
        with pytest.raises(InvalidRequest) as err:
            sampling_params_from_proto(bad, stream=False)
        assert status_for(err.value) == grpc.StatusCode.INVALID_ARGUMENT


def test_kv_transfer_params_json_first_then_legacy():
    request = pb.GenerateRequest(kv_transfer_params_json='{"do_remote_prefill": true}')
    assert kv_transfer_params_from_request(request) == {"do_remote_prefill": True}
    legacy = pb.GenerateRequest(
        kv_transfer_params=pb.KvTransferParams(remote_host="h", remote_port=9)
    )
    assert kv_transfer_params_from_request(legacy) == {"remote_host": "h", "remote_port": 9}
    for bad in (
        pb.GenerateRequest(kv_transfer_params_json="[1]"),
        pb.GenerateRequest(kv_transfer_params=pb.KvTransferParams(remote_host="h")),
    ):
        with pytest.raises(InvalidRequest):
            kv_transfer_params_from_request(bad)
    assert kv_transfer_params_from_request(pb.GenerateRequest()) is None
