"""POST /v1/embeddings over the workers' Embed RPC (pooling models)."""

from __future__ import annotations

import asyncio
import base64
import struct
from typing import Any

import grpc
from tokenizers import Tokenizer

from gateway.api.protocol import EmbeddingRequest
from gateway.errors import GatewayError, check_model, from_grpc, parse_body
from gateway.observability.request_log import engine_request_id
from gateway.workers.pool import WorkerPool
from protos import vllm_engine_pb2 as pb


class EmbeddingService:
    def __init__(self, model_name: str, tokenizer: Tokenizer, pool: WorkerPool) -> None:
        self.model_name, self.tokenizer, self.pool = model_name, tokenizer, pool

    async def create(self, body: Any) -> dict:
        request = parse_body(EmbeddingRequest, body)
        check_model(request.model, self.model_name)
        if request.dimensions is not None:
            raise GatewayError("dimensions is not supported by this model", 400, "dimensions")
        worker = self.pool.pick()
        if worker.facts.is_generation:
            raise GatewayError("this model does not support embeddings", 400, "model")
        inputs = self._token_ids(request.input, worker.facts.max_context_length)
        try:
            replies = await asyncio.gather(
                *(
                    worker.embed(
                        pb.EmbedRequest(
                            request_id=f"embd-{engine_request_id(None)}-{i}",
                            tokenized=pb.TokenizedInput(input_ids=ids),
                        )
                    )
                    for i, ids in enumerate(inputs)
                )
            )
        except grpc.aio.AioRpcError as error:
            raise from_grpc(error) from None
        tokens = sum(r.prompt_tokens for r in replies)
        return {
            "object": "list",
            "model": self.model_name,
            "data": [
                {
                    "object": "embedding",
                    "index": i,
                    "embedding": _encode(list(r.embedding), request.encoding_format),
                }
                for i, r in enumerate(replies)
            ],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    def _token_ids(self, value, max_len: int) -> list[list[int]]:
        items = (
            [value]
            if isinstance(value, str) or (value and isinstance(value[0], int))
            else list(value)
        )
        if not items:
            raise GatewayError("input must not be empty", 400, "input")
        out = [
            self.tokenizer.encode(i, add_special_tokens=True).ids if isinstance(i, str) else list(i)
            for i in items
        ]
        for ids in out:
            if not ids or len(ids) > max_len:
                raise GatewayError(
                    f"each input must have 1 to {max_len} tokens, got {len(ids)}", 400, "input"
                )
        return out


def _encode(vector: list[float], fmt: str) -> list[float] | str:
    if fmt == "float":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
