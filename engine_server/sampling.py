"""Proto SamplingParams to vLLM SamplingParams: every field, proto3 zero values read as unset."""

from __future__ import annotations

import json

from vllm.exceptions import VLLMClientError
from vllm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams

from engine_server.errors import InvalidRequest


def sampling_params_from_proto(
    params,
    *,
    stream: bool,
    kv_transfer_params: dict | None = None,
    thinking_token_budget: int | None = None,
    allowed_token_ids: list[int] | None = None,
) -> SamplingParams:
    """`thinking_token_budget`, `allowed_token_ids`: from the call's metadata
    (protos/extensions.py), not the proto; the engine enforces a thinking budget where its
    reasoning config is on and refuses it otherwise."""
    stop = list(params.stop) or None
    try:
        return SamplingParams(
            temperature=params.temperature if params.HasField("temperature") else 1.0,
            top_p=params.top_p or 1.0,
            top_k=params.top_k,
            min_p=params.min_p,
            frequency_penalty=params.frequency_penalty,
            presence_penalty=params.presence_penalty,
            repetition_penalty=params.repetition_penalty or 1.0,
            max_tokens=params.max_tokens if params.HasField("max_tokens") else None,
            min_tokens=params.min_tokens,
            stop=stop,
            stop_token_ids=list(params.stop_token_ids) or None,
            include_stop_str_in_output=params.include_stop_str_in_output,
            skip_special_tokens=params.skip_special_tokens,
            spaces_between_special_tokens=params.spaces_between_special_tokens,
            ignore_eos=params.ignore_eos,
            n=params.n or 1,
            logprobs=params.logprobs if params.HasField("logprobs") else None,
            prompt_logprobs=params.prompt_logprobs if params.HasField("prompt_logprobs") else None,
            seed=params.seed if params.HasField("seed") else None,
            logit_bias=dict(params.logit_bias) or None,
            thinking_token_budget=thinking_token_budget,
            allowed_token_ids=allowed_token_ids,
            structured_outputs=structured_outputs_from_proto(params),
            extra_args={"kv_transfer_params": kv_transfer_params} if kv_transfer_params else None,
            # Token ids go back on the wire and the client detokenizes; the engine only needs
            # text to find stop strings.
            detokenize=bool(stop),
            output_kind=RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY,
        )
    except (ValueError, VLLMClientError) as error:
        raise InvalidRequest(f"sampling_params: {error}") from error


def structured_outputs_from_proto(params) -> StructuredOutputsParams | None:
    kind = params.WhichOneof("constraint")
    if kind is None:
        return None
    if kind == "json_schema":
        try:
            json.loads(params.json_schema)
        except json.JSONDecodeError as error:
            raise InvalidRequest(f"sampling_params.json_schema: not valid JSON: {error}") from None
        return StructuredOutputsParams(json=params.json_schema)
    if kind == "choice":
        if not params.choice.choices:
            raise InvalidRequest("sampling_params.choice: at least one choice is required")
        return StructuredOutputsParams(choice=list(params.choice.choices))
    if kind == "json_object":
        return StructuredOutputsParams(json_object=True) if params.json_object else None
    # regex, grammar and structural_tag carry the same names in vLLM.
    return StructuredOutputsParams(**{kind: getattr(params, kind)})


def truncate_prompt(ids: list[int], params, max_model_len: int) -> list[int]:
    """Keep the last `truncate_prompt_tokens` ids, as vLLM truncates for generation (-1: the
    model's limit less one token for output)."""
    if not params.HasField("truncate_prompt_tokens"):
        return ids
    keep = params.truncate_prompt_tokens
    if keep == -1:
        keep = max_model_len - 1
    if keep < 1:
        raise InvalidRequest(
            f"sampling_params.truncate_prompt_tokens must be -1 or >= 1, got {keep}"
        )
    return ids[-keep:] if len(ids) > keep else ids


def kv_transfer_params_from_request(request) -> dict | None:
    """The connector's KV-transfer params: the JSON field, else the legacy typed one."""
    if request.HasField("kv_transfer_params_json"):
        try:
            value = json.loads(request.kv_transfer_params_json)
        except json.JSONDecodeError as error:
            raise InvalidRequest(f"kv_transfer_params_json: not valid JSON: {error}") from None
        if not isinstance(value, dict):
            raise InvalidRequest("kv_transfer_params_json: must be a JSON object")
        return value
    if request.HasField("kv_transfer_params"):
        legacy = request.kv_transfer_params
        if not legacy.remote_host or not 1 <= legacy.remote_port <= 65535:
            raise InvalidRequest(
                "kv_transfer_params: remote_host must be set and remote_port in [1, 65535]"
            )
        return {"remote_host": legacy.remote_host, "remote_port": legacy.remote_port}
    return None
