"""vLLM RequestOutput to GenerateResponse messages, shaped exactly as SMG's servicer sends them.

Streaming: one chunk per engine step per output index with the *delta* token ids, and when an
index finishes a Complete that repeats that last delta (peers know not to count it twice).
Non-streaming: one Complete per index with every token.
"""

from __future__ import annotations

import itertools
import json

from vllm.outputs import CompletionOutput, RequestOutput

from protos import vllm_engine_pb2 as pb


def stream_responses(
    output: RequestOutput, seen: set[int], want: tuple[int | None, int | None]
) -> list[pb.GenerateResponse]:
    responses = []
    for completion in output.outputs:
        first = completion.index not in seen
        seen.add(completion.index)
        responses.append(pb.GenerateResponse(chunk=_chunk(output, completion, first, want)))
        if completion.finish_reason:
            responses.append(pb.GenerateResponse(complete=_complete(output, completion, want)))
    return responses


def final_responses(
    output: RequestOutput, want: tuple[int | None, int | None]
) -> list[pb.GenerateResponse]:
    return [pb.GenerateResponse(complete=_complete(output, c, want)) for c in output.outputs]


def _chunk(
    output: RequestOutput, completion: CompletionOutput, first: bool, want: tuple
) -> pb.GenerateStreamChunk:
    num_logprobs, num_prompt_logprobs = want
    return pb.GenerateStreamChunk(
        token_ids=completion.token_ids,
        prompt_tokens=len(output.prompt_token_ids or ()),
        completion_tokens=len(completion.token_ids),
        cached_tokens=output.num_cached_tokens or 0,
        output_logprobs=output_logprobs(completion, num_logprobs),
        input_logprobs=input_logprobs(output, num_prompt_logprobs) if first else None,
        index=completion.index,
    )


def _complete(
    output: RequestOutput, completion: CompletionOutput, want: tuple
) -> pb.GenerateComplete:
    num_logprobs, num_prompt_logprobs = want
    complete = pb.GenerateComplete(
        output_ids=completion.token_ids,
        finish_reason=completion.finish_reason or "stop",
        prompt_tokens=len(output.prompt_token_ids or ()),
        completion_tokens=len(completion.token_ids),
        cached_tokens=output.num_cached_tokens or 0,
        output_logprobs=output_logprobs(completion, num_logprobs),
        input_logprobs=input_logprobs(output, num_prompt_logprobs),
        index=completion.index,
    )
    if isinstance(completion.stop_reason, int):
        complete.matched_token_id = completion.stop_reason
    elif completion.stop_reason is not None:
        complete.matched_stop_str = str(completion.stop_reason)
    _set_kv_transfer(complete, output.kv_transfer_params)
    return complete


def _set_kv_transfer(complete: pb.GenerateComplete, params: dict | None) -> None:
    if not params:
        return
    complete.kv_transfer_params_json = json.dumps(params)
    host, port = params.get("remote_host"), params.get("remote_port")
    if isinstance(host, str) and isinstance(port, int) and 0 < port < 65536:
        complete.kv_transfer_params.remote_host = host
        complete.kv_transfer_params.remote_port = port


def output_logprobs(completion: CompletionOutput, top: int | None) -> pb.OutputLogProbs | None:
    if top is None or not completion.logprobs:
        return None
    proto = pb.OutputLogProbs()
    for token_id, entry in zip(completion.token_ids, completion.logprobs):
        proto.token_ids.append(token_id)
        proto.token_logprobs.append(entry[token_id].logprob)
        if top:
            proto.top_logprobs.append(_top(entry, top))
    return proto


def input_logprobs(output: RequestOutput, top: int | None) -> pb.InputLogProbs | None:
    if top is None or not output.prompt_logprobs:
        return None
    proto = pb.InputLogProbs()
    for token_id, entry in zip(output.prompt_token_ids, output.prompt_logprobs):
        value = pb.InputTokenLogProb()
        if entry is not None and token_id in entry:  # the first prompt token has none
            value.value = entry[token_id].logprob
        proto.token_logprobs.append(value)
        proto.token_ids.append(token_id)
        if top:
            proto.top_logprobs.append(_top(entry or {}, top))
    return proto


def _top(entry: dict, top: int) -> pb.TopLogProbs:
    """The entry's first `top` items, as smg-grpc-servicer sends them: vLLM orders an entry as
    the sampled token, then the top-k by rank (the sampled one not repeated). This is also the
    list vLLM's chat server shows as `top_logprobs`, so a gateway can show it as it comes."""
    chosen = list(itertools.islice(entry.items(), top if top > 0 else None))
    return pb.TopLogProbs(
        token_ids=[tid for tid, _ in chosen], values=[lp.logprob for _, lp in chosen]
    )
