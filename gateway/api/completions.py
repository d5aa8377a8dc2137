"""POST /v1/completions: prompts as text or token ids, no chat template."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse

from gateway.api import kv_transfer
from gateway.api.audio.whisper import generation_refused, is_whisper
from gateway.api.kv_transfer import check_token_ids
from gateway.api.protocol import CompletionRequest
from gateway.api.sampling import check_max_tokens, max_tokens_for, to_proto, truncate_prompt
from gateway.errors import GatewayError, check_model, parse_body
from gateway.observability.metrics import GatewayMetrics
from gateway.observability.request_log import engine_request_id
from gateway.render.model_files import ModelFiles
from gateway.render.renderer import token_ids
from gateway.stream import sse
from gateway.stream.detokenizer import decode_prompt
from gateway.stream.generation import Choice, Generation, Usage
from gateway.stream.logprobs import Position, TokenTexts, completion_logprobs
from gateway.stream.sse import ChunkWriter
from gateway.workers.pool import WorkerPool
from protos import vllm_engine_pb2 as pb


class CompletionService:
    def __init__(
        self,
        model_name: str,
        files: ModelFiles,
        pool: WorkerPool,
        metrics: GatewayMetrics,
        token_texts: TokenTexts,
    ) -> None:
        self.model_name = model_name
        self.tokenizer, self.added = files.tokenizer, files.added_tokens
        self.transcription_only = is_whisper(files.config)
        self.clean_up_spaces = files.clean_up_spaces
        self.pool, self.metrics, self.token_texts = pool, metrics, token_texts

    async def create(self, body: Any) -> JSONResponse | StreamingResponse:
        request = parse_body(CompletionRequest, body)
        check_model(request.model, self.model_name)
        if self.transcription_only:
            raise generation_refused()
        if request.suffix is not None:
            raise GatewayError("suffix is not supported", 400, "suffix")
        if request.echo and request.logprobs is not None:
            raise GatewayError("echo with logprobs is not supported", 400, "echo")
        request_id = f"cmpl-{engine_request_id(request.request_id)}"
        prompts = self._prompts(request)
        budget = request.thinking_token_budget is not None
        worker = self.pool.pick(prompts[0][0], thinking_budget=budget)
        runs = [
            Generation(
                request,
                worker,
                self._generate(request, f"{request_id}-{i}", ids, worker),
                self.tokenizer,
                self.added,
                first_index=i * request.n,
                metrics=self.metrics,
                reroute=functools.partial(
                    self.pool.reroute, prompt_ids=ids, thinking_budget=budget
                ),
            )
            for i, (ids, _text) in enumerate(prompts)
        ]
        texts = [text for _ids, text in prompts]
        reply = _Reply(self.model_name, request_id, request, runs, texts, self.token_texts)
        if request.stream:
            return sse.event_stream(reply.sse())
        await asyncio.gather(*(run.run() for run in runs))
        return JSONResponse(reply.body())

    def _prompts(self, request: CompletionRequest) -> list[tuple[list[int], str]]:
        prompt = request.prompt
        if isinstance(prompt, str) or prompt and isinstance(prompt[0], int):
            prompt = [prompt]
        if not prompt:
            raise GatewayError("prompt must not be empty", 400, "prompt")
        out = []
        for item in prompt:
            if isinstance(item, str):
                out.append((token_ids(self.tokenizer, item, add_special_tokens=True), item))
            else:
                self._check_token_ids(item)
                out.append((list(item), decode_prompt(self.tokenizer, item, self.clean_up_spaces)))
        return out

    def _check_token_ids(self, ids: list[int]) -> None:
        model_vocab = self.pool.model.vocab_size if self.pool.model else 0
        check_token_ids(ids, self.tokenizer, model_vocab)

    def _generate(
        self, request: CompletionRequest, request_id: str, ids: list[int], worker
    ) -> pb.GenerateRequest:
        facts = worker.facts
        if not ids:
            raise GatewayError("prompt must not be empty", 400, "prompt")
        ids = truncate_prompt(ids, request.truncate_prompt_tokens, facts.max_context_length)
        check_max_tokens(request.requested_max_tokens(), facts.max_context_length, "max_tokens")
        max_tokens = max_tokens_for(
            request.requested_max_tokens(),
            len(ids),
            facts.max_context_length,
            facts.sampling_defaults,
            prompt_param="prompt",
        )
        return pb.GenerateRequest(
            request_id=request_id,
            tokenized=pb.TokenizedInput(input_ids=ids),
            sampling_params=to_proto(request, max_tokens, facts.sampling_defaults),
            stream=request.stream,  # non-streamed: one Complete per choice, every token in it
            kv_transfer_params_json=kv_transfer.to_engine(request.kv_transfer_params, chat=False),
        )


class _Reply:
    def __init__(
        self,
        model: str,
        request_id: str,
        request: CompletionRequest,
        runs: list[Generation],
        prompt_texts: list[str],
        token_texts: TokenTexts,
    ) -> None:
        self.model, self.id, self.request, self.runs = model, request_id, request, runs
        self.prompt_texts = prompt_texts
        self.token_texts = token_texts
        self.streamed_chars: dict[int, int] = {}
        self.created = int(time.time())
        self._writer = ChunkWriter(self.id, "text_completion", self.created, model)

    def _usage(self) -> dict:
        total = Usage(
            sum(r.usage.prompt_tokens for r in self.runs),
            sum(r.usage.cached_tokens for r in self.runs),
            sum(r.usage.completion_tokens for r in self.runs),
        )
        return total.as_dict()

    def body(self) -> dict:
        choices = []
        for run, prompt in zip(self.runs, self.prompt_texts):
            for choice in run.choices:
                text = choice.text.release(finished=True)
                choices.append(
                    {
                        "index": choice.index,
                        "text": (prompt + text) if self.request.echo else text,
                        "logprobs": self._logprobs(choice.logprobs),
                        "finish_reason": choice.finish_reason,
                        "stop_reason": choice.stop_reason,
                    }
                )
        return {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": sorted(choices, key=lambda c: c["index"]),
            "usage": self._usage(),
            **kv_transfer.in_response(self.runs[0].kv_transfer_params),
        }

    async def sse(self) -> AsyncIterator[str]:
        for run, prompt in zip(self.runs, self.prompt_texts):
            if self.request.echo:
                for choice in run.choices:
                    yield self._event(choice.index, prompt, None)
            async for choice, finished in run.responses():
                delta = choice.text.release(finished=finished)
                logprobs = self._stream_logprobs(choice)
                if delta or finished or logprobs:
                    yield self._event(
                        choice.index,
                        delta,
                        choice.finish_reason if finished else None,
                        logprobs,
                    )
        options = self.request.stream_options
        if options and options.include_usage:
            yield self._writer.chunk([], self._usage())

    def _logprobs(self, positions: list[Position]) -> dict | None:
        if self.request.logprobs is None:
            return None
        return completion_logprobs(self.token_texts, positions, self.request.logprobs)

    def _stream_logprobs(self, choice: Choice) -> dict | None:
        if self.request.logprobs is None:
            return None
        positions, context = choice.unsent_logprobs()
        if not positions:
            return None
        offset = self.streamed_chars.get(choice.index, 0)
        return completion_logprobs(
            self.token_texts, positions, self.request.logprobs, offset, context
        )

    def _event(
        self, index: int, text: str, finish: str | None, logprobs: dict | None = None
    ) -> str:
        self.streamed_chars[index] = self.streamed_chars.get(index, 0) + len(text)
        choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
        return self._writer.chunk([choice])
