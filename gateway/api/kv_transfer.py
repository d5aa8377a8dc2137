"""KV-transfer params (`kv_transfer_params`) for disaggregated prefill and decode, handled as
vLLM's server handles them: the request's object goes to the engine's KV connector (on the
wire, `GenerateRequest.kv_transfer_params_json`), and what the engine's connector returns
comes back in the non-streamed response, where a PD proxy reads the prefill side's handoff.

One key is a chat's own: `prompt_token_ids`, the prefill side's prompt, which a decode side
uses instead of rendering the messages again. As in vLLM, a chat takes it off before the
params go to the engine, uses it when the messages are text only, and ignores it when they
hold media (they must be rendered to be expanded).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from tokenizers import Tokenizer

from gateway.errors import GatewayError

PROMPT_IDS = "prompt_token_ids"
PROMPT_IDS_PARAM = "kv_transfer_params.prompt_token_ids"


def to_engine(params: dict[str, Any] | None, chat: bool = True) -> str | None:
    """The params for the engine's connector (None when there are none, as vLLM sends none
    for an empty object). A chat keeps `prompt_token_ids` to itself; vLLM's completions
    route forwards the object verbatim, and so does this one."""
    if not params:
        return None
    forwarded = {k: v for k, v in params.items() if k != PROMPT_IDS} if chat else params
    return json.dumps(forwarded) if forwarded else None


def reused_prompt_ids(params: dict[str, Any] | None) -> list[int] | None:
    """The forwarded prompt, checked as vLLM checks it (None: there is none)."""
    ids = (params or {}).get(PROMPT_IDS)
    if ids is None:
        return None
    # bool is an int subclass, hence the exact type check (vLLM's too).
    if not isinstance(ids, list) or not ids or any(type(x) is not int or x < 0 for x in ids):
        raise GatewayError(
            "`kv_transfer_params['prompt_token_ids']` must be a non-empty list "
            "of non-negative integers.",
            400,
            PROMPT_IDS_PARAM,
        )
    return ids


def in_response(returned: dict[str, Any] | None) -> dict[str, Any]:
    """The engine connector's params under vLLM's response key, only when it returned some."""
    return {} if returned is None else {"kv_transfer_params": returned}


def check_token_ids(
    ids: Sequence[int], tokenizer: Tokenizer, model_vocab: int, param: str = "prompt"
) -> None:
    """vLLM's validate_token_ids: a negative id, or one past both the tokenizer's and the
    model's vocabulary, is refused with its message."""
    if not ids:
        return
    last = max(tokenizer.get_vocab_size(with_added_tokens=True) - 1, model_vocab - 1)
    for bad in (min(ids), max(ids)):
        if not 0 <= bad <= last:
            raise GatewayError(f"Token id {bad} is out of vocabulary", 400, param)
