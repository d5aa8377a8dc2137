"""An OpenAI request's sampling fields onto the wire's SamplingParams, as vLLM maps them.

Precedence as in vLLM's server: the request's value, else the model's generation-config
default (GetModelInfo.default_sampling_params_json), else OpenAI's default.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gateway.api.protocol import SamplingFields
from gateway.errors import SamplingError
from protos import vllm_engine_pb2 as pb

OPENAI_DEFAULTS = {
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
}


def check_max_tokens(requested: int | None, max_model_len: int, param: str) -> None:
    """vLLM's TokenizeParams check: more output tokens than the whole context is a 400 (up
    to that, the request is clamped to the room the prompt leaves)."""
    if requested is not None and requested > max_model_len:
        raise SamplingError(
            f"{param}={requested} cannot be greater than max_model_len={max_model_len}. "
            "Please request fewer output tokens.",
            param=param,
        )


def max_tokens_for(
    requested: int | None,
    prompt_len: int,
    max_model_len: int,
    defaults: Mapping[str, Any],
    prompt_param: str = "messages",
) -> int:
    """vLLM's get_max_tokens: what fits in the context, capped by the request or default.
    `prompt_param`: the request field a too-long prompt came from."""
    if prompt_len > max_model_len:
        raise SamplingError(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"request has {prompt_len} input tokens. Please reduce the length of the input "
            "messages.",
            param=prompt_param,
        )
    room = max_model_len - prompt_len
    wanted = requested if requested is not None else defaults.get("max_tokens")
    return min(room, wanted) if wanted is not None else room


def to_proto(
    request: SamplingFields, max_tokens: int | None, defaults: Mapping[str, Any]
) -> pb.SamplingParams:
    chosen = {
        name: value
        if (value := getattr(request, name)) is not None
        else defaults.get(name, default)
        for name, default in OPENAI_DEFAULTS.items()
    }
    try:
        params = _params(request, max_tokens, chosen)
    except ValueError as error:  # a value the request validation let through and the wire won't
        raise SamplingError(f"a sampling parameter is out of range: {error}") from None
    _set_optional(params, request)
    _set_constraint(params, request)
    return params


def _params(
    request: SamplingFields, max_tokens: int | None, chosen: Mapping[str, Any]
) -> pb.SamplingParams:
    return pb.SamplingParams(
        temperature=chosen["temperature"],
        top_p=chosen["top_p"],
        top_k=_top_k(chosen["top_k"]),
        min_p=chosen["min_p"],
        frequency_penalty=chosen["frequency_penalty"],
        presence_penalty=chosen["presence_penalty"],
        repetition_penalty=chosen["repetition_penalty"],
        max_tokens=max_tokens,
        min_tokens=request.min_tokens,
        stop=request.stop_list(),
        stop_token_ids=request.stop_token_ids or [],
        skip_special_tokens=request.skip_special_tokens,
        spaces_between_special_tokens=request.spaces_between_special_tokens,
        ignore_eos=request.ignore_eos,
        n=request.n,
        include_stop_str_in_output=request.include_stop_str_in_output,
        logit_bias=_logit_bias(request.logit_bias),
    )


def _top_k(value: int) -> int:
    # vLLM takes -1 or 0 for "no top-k"; the wire's uint32 says 0.
    if value < -1:
        raise SamplingError("top_k must be -1 (disabled) or at least 1", param="top_k")
    return max(value, 0)


def _logit_bias(bias: Mapping[str, float] | None) -> dict[int, float]:
    """vLLM's checks and messages; ids past the wire's int32 are out of any vocabulary (the
    worker checks the rest against the model's)."""
    converted, invalid = {}, []
    for token, value in (bias or {}).items():
        try:
            converted[int(token)] = float(value)
        except ValueError:
            invalid.append(token)
    if invalid:
        raise SamplingError(
            "logit_bias contains key(s) that cannot be converted to integer token IDs: "
            f"{invalid!r}",
            param="logit_bias",
        )
    if outside := [t for t in converted if not 0 <= t < 2**31]:
        raise SamplingError(
            f"token_id(s) {outside} in logit_bias contain out-of-vocab token ids",
            param="logit_bias",
        )
    return converted


def _set_optional(params: pb.SamplingParams, request: SamplingFields) -> None:
    logprobs = request.output_logprobs()
    if logprobs is not None:
        params.logprobs = logprobs
    if request.prompt_logprobs is not None:
        params.prompt_logprobs = request.prompt_logprobs
    if request.seed is not None:
        params.seed = request.seed
    # truncate_prompt_tokens is applied by the gateway (truncate_prompt): not every worker
    # applies it to token-id prompts (smg-grpc-servicer does not).


def _set_constraint(params: pb.SamplingParams, request: SamplingFields) -> None:
    fmt = request.response_format
    if fmt is not None and fmt.type == "json_object":
        params.json_object = True
        return
    if fmt is not None and fmt.type == "json_schema":
        params.json_schema = json.dumps(fmt.json_schema.json_schema)
        return
    so = request.structured_outputs
    if so is None:
        return
    if so.json_ is not None:
        params.json_schema = so.json_ if isinstance(so.json_, str) else json.dumps(so.json_)
    elif so.choice is not None:
        params.choice.choices.extend(so.choice)
    elif so.json_object:
        params.json_object = True
    for field in ("regex", "grammar", "structural_tag"):
        if getattr(so, field) is not None:
            setattr(params, field, getattr(so, field))


def truncate_prompt(ids: list[int], keep: int | None, max_model_len: int) -> list[int]:
    """vLLM's truncation for generation: keep the last `keep` ids; -1 keeps as many as the
    context allows with one token left for output. A `keep` above the context is refused."""
    if keep is None:
        return ids
    if keep > max_model_len:
        raise SamplingError(
            f"truncate_prompt_tokens={keep} cannot be greater than max_model_len="
            f"{max_model_len}. Please request a smaller truncation size.",
            param="truncate_prompt_tokens",
        )
    if keep < 0:
        keep = max_model_len - 1
    if keep >= len(ids):
        return ids
    return ids[-keep:] if keep else []
