"""POST /v1/chat/completions: render, preprocess, sample, stream from a worker, detokenize."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi.responses import JSONResponse, StreamingResponse
from tokenizers import Tokenizer

from gateway import sse
from gateway.chat import ChatRenderer, ChatRequestError, RenderedChat
from gateway.detokenizer import added_tokens
from gateway.errors import GatewayError, check_model, parse_body
from gateway.logprobs import TokenTexts, chat_content, chat_logprobs
from gateway.metrics import GatewayMetrics
from gateway.pool import WorkerPool
from gateway.protocol import UNTRUSTED_TEMPLATE, ChatCompletionRequest, ChatPromptFields
from gateway.request_log import engine_request_id
from gateway.sampling import SamplingError, max_tokens_for, to_proto, truncate_prompt
from gateway.sse import ChunkWriter
from gateway.streaming import Choice, Generation, Usage, per_choice
from gateway.worker import Worker
from multimodal.errors import MediaError
from multimodal.media import MediaPolicy, decode_sources, download_all, needs_download
from multimodal.pipeline import PixelEncoding, Prepared, prepare
from multimodal.processors.base import ImageProcessor, OptionError
from multimodal.prompt import PromptError
from multimodal.wire import Piece, field_number, field_pieces
from protos import vllm_engine_pb2 as pb

_MM_INPUTS = field_number(pb.GenerateRequest, "mm_inputs")


@dataclass
class Prompt:
    ids: list[int]
    text: str
    # With images: the serialized MultimodalInputs (pieces viewing the tensors) and their count.
    mm_inputs: list[Piece] | None = None
    images: int = 0


class ChatService:
    def __init__(
        self,
        model_name: str,
        renderer: ChatRenderer,
        tokenizer: Tokenizer,
        processor: ImageProcessor | None,
        pool: WorkerPool,
        media_policy: MediaPolicy,
        http_client: httpx.AsyncClient,
        metrics: GatewayMetrics,
        clean_up_spaces: bool = False,
    ) -> None:
        self.model_name = model_name
        self.renderer = renderer
        self.tokenizer = tokenizer
        self.added = added_tokens(tokenizer)
        self.processor = processor
        self.pool = pool
        self.media_policy = media_policy
        self.http = http_client
        self.metrics = metrics
        self.token_texts = TokenTexts(tokenizer, clean_up_spaces)

    async def create(self, body: Any) -> JSONResponse | StreamingResponse:
        request = parse_body(ChatCompletionRequest, body)
        check_model(request.model, self.model_name)
        rendered = self._render(request)
        worker = self.pool.pick(rendered.token_ids)
        facts = worker.facts
        prompt = await self._expand(request, facts.pixels, rendered)
        if prompt.mm_inputs is not None and not facts.supports_vision:
            raise GatewayError("the engine worker does not accept images", 400, "messages")
        if prompt.mm_inputs is not None:
            _check_image_limit(prompt.images, facts)
        prompt.ids = _truncated(request.truncate_prompt_tokens, prompt, facts.max_context_length)
        max_tokens = _max_tokens(request, len(prompt.ids), facts)
        generate = pb.GenerateRequest(
            request_id=f"chatcmpl-{engine_request_id(request.request_id)}",
            tokenized=pb.TokenizedInput(input_ids=prompt.ids, original_text=prompt.text),
            sampling_params=to_proto(request, max_tokens, facts.sampling_defaults),
            # a non-streamed reply needs only the final message (one Complete per choice)
            stream=request.stream,
        )
        # The pixels go out as a field appended to the serialized request, never copied into it.
        tail = () if prompt.mm_inputs is None else field_pieces(_MM_INPUTS, prompt.mm_inputs)
        run = _Run(self, request, worker, generate, prompt.ids, tail)
        if request.stream:
            return sse.event_stream(run.sse())
        return JSONResponse(await run.complete())

    async def prompt(self, request: ChatPromptFields, pixels: PixelEncoding) -> Prompt:
        """Rendered, tokenized and (with images) preprocessed for an engine taking `pixels`."""
        return await self._expand(request, pixels, self._render(request))

    def _render(self, request: ChatPromptFields) -> RenderedChat:
        if request.chat_template is not None:
            raise GatewayError(UNTRUSTED_TEMPLATE, 400, "chat_template")
        try:
            # vLLM renders tools even with tool_choice "none" (unless told otherwise).
            rendered = self.renderer.render(
                request.messages,
                add_generation_prompt=request.add_generation_prompt,
                continue_final_message=request.continue_final_message,
                tools=request.tools,
                chat_template_kwargs=request.chat_template_kwargs,
                add_special_tokens=request.add_special_tokens,
            )
        except ChatRequestError as error:
            raise GatewayError(str(error), 400, "messages") from error
        return rendered

    async def _expand(
        self, request: ChatPromptFields, pixels: PixelEncoding, rendered: RenderedChat
    ) -> Prompt:
        if not rendered.image_urls:
            return Prompt(rendered.token_ids, rendered.prompt)
        return await self._with_images(request, pixels, rendered)

    async def _with_images(self, request, pixels: PixelEncoding, rendered) -> Prompt:
        if self.processor is None:
            raise GatewayError("this model does not accept images", 400, "messages")
        urls = [url for url, _detail in rendered.image_urls]
        try:
            started = time.perf_counter()
            downloaded: list[bytes | None] = [None] * len(urls)
            if needs_download(urls):  # (data: URIs need no task, no turn of the event loop)
                downloaded = await download_all(urls, self.media_policy, self.http)
            fetched = time.perf_counter()
            # Decoding and preprocessing in one worker thread: one hand-off of the GIL-bound
            # glue between them instead of two (measured: 10-20% less gateway CPU per image
            # request at 32 concurrent, benchmarks/RESULTS.md).
            prepared, encoded = await asyncio.to_thread(
                self._decode_and_prepare, urls, downloaded, request, pixels, rendered.token_ids
            )
            self.metrics.preprocess.labels("fetch").observe(fetched - started)
            self.metrics.preprocess.labels("process").observe(time.perf_counter() - fetched)
            self.metrics.images.inc(len(urls))
        except MediaError as error:
            raise GatewayError(f"invalid image: {error}", 400, "messages") from error
        except (OptionError, PromptError) as error:
            raise GatewayError(str(error), 400, "mm_processor_kwargs") from error
        return Prompt(prepared.prompt_ids, rendered.prompt, encoded, len(prepared.ranges))

    def _decode_and_prepare(
        self, urls, downloaded, request, pixels, prompt_ids
    ) -> tuple[Prepared, list[Piece]]:
        images = decode_sources(urls, downloaded, self.media_policy)
        options = request.mm_processor_kwargs or {}
        prepared = prepare(self.processor, prompt_ids, images, options, pixels)
        return prepared, prepared.encoded_mm_inputs()


def _check_image_limit(images: int, facts) -> None:
    # vLLM's own processor refuses these with this message; a worker fed preprocessed input
    # may not (smg-grpc-servicer only advertises the limit), so the gateway holds to it.
    limit = facts.mm_item_limits.get("image")
    if limit is not None and images > limit:
        message = f"At most {limit} image(s) may be provided in one prompt."
        raise GatewayError(message, 400, "messages")


def _truncated(keep: int | None, prompt: Prompt, max_model_len: int) -> list[int]:
    try:
        ids = truncate_prompt(prompt.ids, keep, max_model_len)
    except SamplingError as error:
        raise GatewayError(str(error), 400, error.param) from None
    if prompt.mm_inputs is not None and len(ids) < len(prompt.ids):
        raise GatewayError(
            "truncate_prompt_tokens would cut a prompt with images", 400, "truncate_prompt_tokens"
        )
    return ids


def _max_tokens(request: ChatCompletionRequest, prompt_len: int, facts) -> int:
    try:
        return max_tokens_for(
            request.requested_max_tokens(),
            prompt_len,
            facts.max_context_length,
            facts.sampling_defaults,
        )
    except SamplingError as error:
        raise GatewayError(str(error), 400, error.param) from None


class _Run:
    """One request's exchange with its worker, rendered as OpenAI JSON or SSE."""

    def __init__(
        self,
        service: ChatService,
        request: ChatCompletionRequest,
        worker: Worker,
        generate: pb.GenerateRequest,
        prompt_ids: list[int],
        tail: Sequence[Piece] = (),
    ) -> None:
        self.service, self.request = service, request
        self.generation = Generation(
            request,
            worker,
            generate,
            service.tokenizer,
            service.added,
            metrics=service.metrics,
            reroute=lambda failed: service.pool.reroute(failed, prompt_ids),
            tail=tail,
        )
        self.choices = self.generation.choices
        self.usage = self.generation.usage
        self.id = generate.request_id
        self.created = int(time.time())

    @functools.cached_property
    def _writer(self) -> ChunkWriter:  # streams only
        return ChunkWriter(self.id, "chat.completion.chunk", self.created, self.service.model_name)

    def _responses(self) -> AsyncIterator[tuple[Choice, bool]]:
        return self.generation.responses()

    async def complete(self) -> dict:
        async for _ in self._responses():
            pass
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.service.model_name,
            "choices": [self._final_choice(c) for c in self.choices],
            "usage": self.usage.as_dict(),
        }

    def _final_choice(self, choice: Choice) -> dict:
        return {
            "index": choice.index,
            "message": {"role": "assistant", "content": choice.text.release(finished=True)},
            "logprobs": (
                chat_logprobs(self.service.token_texts, choice.logprobs, self._top)
                if self.request.logprobs
                else None
            ),
            "finish_reason": choice.finish_reason,
            "stop_reason": choice.stop_reason,
        }

    async def sse(self) -> AsyncIterator[str]:
        options = self.request.stream_options
        usage_at_end = bool(options and options.include_usage)
        continuous = bool(options and options.continuous_usage_stats)
        for choice in self.choices:
            yield self._event(
                [
                    {
                        "index": choice.index,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ]
            )
        async for batch in self.generation.batches():
            events = [self._delta_event(c, done, continuous) for c, done in per_choice(batch)]
            if text := "".join(e for e in events if e):
                yield text
        if usage_at_end:
            yield self._event([], self.usage.as_dict())

    def _delta_event(self, choice: Choice, finished: bool, continuous: bool) -> str:
        delta = choice.text.release(finished=finished)
        logprobs = self._stream_logprobs(choice)
        if not delta and not finished and not logprobs:
            return ""
        entry = {
            "index": choice.index,
            "delta": {"content": delta} if delta else {},
            "logprobs": {"content": logprobs} if logprobs else None,
            "finish_reason": choice.finish_reason if finished else None,
        }
        if finished:
            entry["stop_reason"] = choice.stop_reason
        return self._event([entry], self._running_usage() if continuous else None)

    @property
    def _top(self) -> int:
        return self.request.top_logprobs or 0

    def _stream_logprobs(self, choice: Choice) -> list[dict]:
        if not self.request.logprobs:
            return []
        positions, context = choice.unsent_logprobs()
        return chat_content(self.service.token_texts, positions, self._top, context)

    def _running_usage(self) -> dict:
        generated = sum(c.generated for c in self.choices)
        return Usage(self.usage.prompt_tokens, self.usage.cached_tokens, generated).as_dict()

    def _event(self, choices: list[dict], usage: dict | None = None) -> str:
        return self._writer.chunk(choices, usage)
