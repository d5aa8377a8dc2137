"""GetModelInfo / GetServerInfo / GetLoads answers, read off vLLM's config and live state."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from engine_server.errors import InvalidRequest
from multimodal.shm import shm_namespace_id
from protos import extensions
from protos import vllm_engine_pb2 as pb

SAMPLING_DEFAULT_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
ENCODER_DTYPES = ("float32", "float16", "bfloat16")


def _token_ids(value: Any) -> list[int]:
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, int):
        return [value] if value >= 0 else []
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool) and v >= 0]
    return []


def _first_id(*values: Any) -> int:
    for value in values:
        ids = _token_ids(value)
        if ids:
            return ids[0]
    return 0


def _special_id(name: str, text_config: Any, tokenizer: Any) -> int:
    return _first_id(getattr(text_config, name, None), getattr(tokenizer, name, None))


def eos_token_ids(model_config: Any, tokenizer: Any) -> list[int]:
    """EOS ids as vLLM stops on them: the config's, then the generation config's extras."""
    ids = _token_ids(getattr(model_config.hf_config, "eos_token_id", None))
    if not ids and tokenizer is not None:
        ids = _token_ids(getattr(tokenizer, "eos_token_id", None))
    for extra in _token_ids(model_config.try_get_generation_config().get("eos_token_id")):
        if extra not in ids:
            ids.append(extra)
    return ids


def default_sampling_params_json(model_config: Any) -> str:
    defaults = model_config.get_diff_sampling_param() or {}
    chosen = {k: defaults[k] for k in SAMPLING_DEFAULT_KEYS if defaults.get(k) is not None}
    return json.dumps(chosen, separators=(",", ":")) if chosen else ""


def model_info(model_config: Any, tokenizer: Any) -> pb.GetModelInfoResponse:
    hf = model_config.hf_config
    text = getattr(hf, "get_text_config", lambda: hf)()
    served = model_config.served_model_name
    return pb.GetModelInfoResponse(
        model_path=str(model_config.model),
        is_generation=model_config.runner_type == "generate",
        max_context_length=model_config.max_model_len,
        vocab_size=model_config.get_vocab_size(),
        supports_vision=bool(model_config.is_multimodal_model),
        served_model_name=served[0] if isinstance(served, list) else str(served or ""),
        tokenizer_path=str(model_config.tokenizer or ""),
        model_type=str(getattr(hf, "model_type", "") or ""),
        architectures=list(getattr(hf, "architectures", None) or []),
        eos_token_ids=eos_token_ids(model_config, tokenizer),
        pad_token_id=_special_id("pad_token_id", text, tokenizer),
        bos_token_id=_special_id("bos_token_id", text, tokenizer),
        max_req_input_len=model_config.max_model_len,
        default_sampling_params_json=default_sampling_params_json(model_config),
    )


def device_normalizes(model_config: Any) -> bool:
    """vLLM's resolved mm_device_do_normalize (False on text models and unsupported ones)."""
    if not model_config.is_multimodal_model:
        return False
    return bool(model_config.get_multimodal_config().mm_device_do_normalize)


def encoder_dtype(model_config: Any) -> str:
    name = str(model_config.dtype).removeprefix("torch.")
    return name if name in ENCODER_DTYPES else ""


def engine_modality(model_config: Any, modality: str) -> str:
    """The modality vLLM's model keys an item of this wire modality by: a model whose config
    sets `use_unified_vision_chunk` (Kimi-K2.5) takes images and videos as one
    "vision_chunk" modality (its limit key too), as vLLM's chat parser maps them."""
    unified = getattr(model_config.hf_config, "use_unified_vision_chunk", False)
    return "vision_chunk" if unified and modality in ("image", "video") else modality


def item_limits(model_config: Any) -> str:
    if not model_config.is_multimodal_model:
        return ""
    mm = model_config.get_multimodal_config()
    pairs = [
        f"{m}={mm.get_limit_per_prompt(engine_modality(model_config, m))}"
        for m in ("image", "video", "audio")
    ]
    return ",".join(p for p in pairs if not p.endswith("=0"))


def check_item_counts(mm_config: Any, counts: Mapping[str, int], field: str) -> None:
    """Refuse more items of a modality than --limit-mm-per-prompt allows, as vLLM's own
    processor does (a bypassed or worker-side prompt must too, or the engine core fails)."""
    for modality, count in counts.items():
        limit = mm_config.get_limit_per_prompt(modality)
        if count > limit:
            raise InvalidRequest(
                f"{field}: {count} {modality} items exceed this engine's limit of {limit} "
                "per prompt (--limit-mm-per-prompt)"
            )


def server_info(vllm_config: Any, state: dict[str, Any]) -> pb.GetServerInfoResponse:
    model_config = vllm_config.model_config
    cache, kv = vllm_config.cache_config, vllm_config.kv_transfer_config
    return pb.GetServerInfoResponse(
        active_requests=state["active_requests"],
        is_paused=state["is_paused"],
        last_receive_timestamp=state["last_receive_timestamp"],
        uptime_seconds=time.time() - state["start_time"],
        server_type="vllm-grpc",
        kv_connector=str(getattr(kv, "kv_connector", "") or ""),
        kv_role=str(getattr(kv, "kv_role", "") or ""),
        kv_engine_id=str(getattr(kv, "engine_id", "") or ""),
        data_parallel_size=vllm_config.parallel_config.data_parallel_size,
        shm_namespace_id=shm_namespace_id(),
        kv_cache_dtype=str(cache.cache_dtype or ""),
        block_size=int(cache.block_size or 0),
        model_dtype=str(model_config.dtype),
        pairing_protocol=os.environ.get("SMG_PAIRING_PROTOCOL", ""),
        mm_device_do_normalize=device_normalizes(model_config),
        max_num_seqs=int(vllm_config.scheduler_config.max_num_seqs or 0),
        mm_item_limits=item_limits(model_config),
        multimodal_encoder_dtype=encoder_dtype(model_config),
        engine_reasoning_parser=engine_reasoning_parser(vllm_config),
        constrained_decoding_start=constrained_decoding_start(vllm_config),
    )


def capabilities(vllm_config: Any) -> set[str]:
    """mmgate's wire additions this worker applies (protos/extensions.py). The thinking
    budget only where vLLM enforces it: a reasoning config whose token ids resolved (vLLM's
    input processor refuses a budget otherwise); allowed token ids and preprocessed audio
    always."""
    reasoning = getattr(vllm_config, "reasoning_config", None)
    enforced = reasoning is not None and reasoning.enabled
    names = {extensions.TAKES_ALLOWED_TOKEN_IDS, extensions.TAKES_AUDIO_MM_INPUTS}
    return names | {extensions.ENFORCES_THINKING_BUDGET} if enforced else names


def engine_reasoning_parser(vllm_config: Any) -> str:
    """The engine's ``--reasoning-parser`` (its structured-outputs config's), "" for none."""
    structured = getattr(vllm_config, "structured_outputs_config", None)
    return str(getattr(structured, "reasoning_parser", "") or "")


def constrained_decoding_start(vllm_config: Any) -> str:
    """Where the engine starts a request's grammar on a prompt that leaves the model thinking:
    vLLM's structured-output manager waits for the reasoning parser to see the thought end
    unless ``enable_in_reasoning`` is set (a request's ``grammar_from_first_token`` overrides
    it: ``reasoning_ended``)."""
    structured = getattr(vllm_config, "structured_outputs_config", None)
    if engine_reasoning_parser(vllm_config) and not getattr(
        structured, "enable_in_reasoning", False
    ):
        return "after_reasoning"
    return "first_token"


def latest_scheduler_stats(engine: Any) -> Any | None:
    """The freshest SchedulerStats vLLM's logging stat logger kept (None before the first step)."""
    manager = getattr(engine, "logger_manager", None)
    for logger in getattr(manager, "stat_loggers", None) or []:
        stats = getattr(logger, "last_scheduler_stats", None)
        if stats is not None:
            return stats
        per_engine = getattr(logger, "per_engine_stat_loggers", None) or {}
        for nested in per_engine.values():
            if getattr(nested, "last_scheduler_stats", None) is not None:
                return nested.last_scheduler_stats
    return None


def loads(engine: Any, running: int, waiting: int, version: str) -> pb.GetLoadsResponse:
    """Queue depth from our own in-flight accounting; KV usage from vLLM's scheduler stats."""
    vllm_config = engine.vllm_config
    stats = latest_scheduler_stats(engine)
    cache = vllm_config.cache_config
    capacity = (cache.num_gpu_blocks or 0) * (cache.block_size or 0)
    usage = float(getattr(stats, "kv_cache_usage", 0.0) or 0.0)
    load = pb.SchedulerLoad(
        dp_rank=vllm_config.parallel_config.data_parallel_rank,
        num_running_reqs=running,
        num_waiting_reqs=waiting,
        num_total_reqs=running + waiting,
        num_used_tokens=int(usage * capacity),
        max_total_num_tokens=capacity,
        token_usage=usage,
        utilization=usage,
        max_running_requests=int(vllm_config.scheduler_config.max_num_seqs or 0),
    )
    return pb.GetLoadsResponse(
        timestamp=datetime.now(timezone.utc).isoformat(),
        version=version,
        dp_rank_count=1,
        loads=[load],
    )
