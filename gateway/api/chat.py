"""POST /v1/chat/completions: render, preprocess, sample, stream from a worker, detokenize."""

from __future__ import annotations

import functools
import time
from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse

from gateway.api import kv_transfer
from gateway.api.audio.whisper import generation_refused, is_whisper
from gateway.api.chat_messages import VLLM_NULLS, delta_json, merged, tool_call_json
from gateway.api.kv_transfer import check_token_ids
from gateway.api.protocol import ChatCompletionRequest
from gateway.api.sampling import check_max_tokens, max_tokens_for, to_proto, truncate_prompt
from gateway.errors import GatewayError, check_model, parse_body
from gateway.observability import tracing
from gateway.observability.metrics import GatewayMetrics
from gateway.observability.request_log import engine_request_id
from gateway.parsers.config import ParsingConfig, TokenizerVocab
from gateway.parsers.delegating import ChatParsing, ChoiceParser
from gateway.parsers.request_adjust import grammar_from_first_token, plan_parsing
from gateway.render.messages import MediaItem
from gateway.render.model_files import ModelFiles
from gateway.render.prompt import Prompt, PromptBuilder
from gateway.render.renderer import RenderedChat
from gateway.stream import sse
from gateway.stream.generation import Choice, Generation, Usage, per_choice
from gateway.stream.logprobs import TokenTexts, chat_content, chat_logprobs
from gateway.stream.sse import ChunkWriter
from gateway.workers.pool import WorkerPool
from gateway.workers.worker import Worker, WorkerFacts
from protos import vllm_engine_pb2 as pb

# A stream chunk's choices and usage (None: the chunk carries none), as chat writes them.
Chunk = tuple[list[dict], "dict | None"]


class ChatService:
    def __init__(
        self,
        model_name: str,
        files: ModelFiles,
        prompts: PromptBuilder,
        pool: WorkerPool,
        metrics: GatewayMetrics,
        token_texts: TokenTexts,
        parsing: ParsingConfig | None = None,
    ) -> None:
        self.model_name = model_name
        self.tokenizer = files.tokenizer
        self.transcription_only = is_whisper(files.config)
        self.added = files.added_tokens
        self.prompts = prompts
        self.pool = pool
        self.metrics = metrics
        self.token_texts = token_texts
        self.parsing = parsing or ParsingConfig()
        self.vocab = TokenizerVocab(
            special_tokens=files.special_added_tokens,
            added_tokens=frozenset(self.added.values()),
        )

    def token_strings(self, ids: list[int]) -> list[str]:
        """Each token's vocabulary string (added tokens, such as parser markers, as written)."""
        to_token = self.tokenizer.id_to_token
        return [to_token(i) or "" for i in ids]

    async def create(self, body: Any) -> JSONResponse | StreamingResponse:
        with tracing.span("mmgate.render"):
            request = parse_body(ChatCompletionRequest, body)
        run = await self.start(request)
        if request.stream:
            return sse.event_stream(run.sse())
        return JSONResponse(await run.complete())

    async def start(self, request: ChatCompletionRequest) -> ChatRun:
        """Render, preprocess and send a parsed request to a worker; the run reads its reply
        (chat completions format it; the Messages and Responses APIs convert it)."""
        with tracing.span("mmgate.render"):
            self.prepare(request)
            rendered = self.prompts.render(request)
        parsing = plan_parsing(
            self.parsing, request, lambda: self.token_strings(rendered.token_ids), self.vocab
        )
        by_worker, audio_inputs = self._media_route(rendered)
        budget = request.thinking_token_budget is not None
        prompt, worker = await self._prepared(request, rendered, by_worker, audio_inputs, budget)
        facts = worker.facts
        if prompt.has_media:
            check_items(prompt, facts)
        elif reused := kv_transfer.reused_prompt_ids(request.kv_transfer_params):
            check_token_ids(reused, self.tokenizer, facts.vocab_size, kv_transfer.PROMPT_IDS_PARAM)
            prompt.ids = reused  # the prefill side's prompt, not rendered again (as vLLM)
        prompt.ids = _truncated(request.truncate_prompt_tokens, prompt, facts.max_context_length)
        max_tokens = _max_tokens(request, prompt, facts)
        params = to_proto(request, max_tokens, facts.sampling_defaults)
        if params.WhichOneof("constraint") and grammar_from_first_token(parsing, request):
            params.grammar_from_first_token = True
        generate = pb.GenerateRequest(
            request_id=f"chatcmpl-{engine_request_id(request.request_id)}",
            tokenized=pb.TokenizedInput(input_ids=prompt.ids, original_text=prompt.text),
            sampling_params=params,
            # a non-streamed reply needs only the final message (one Complete per choice)
            stream=request.stream,
            media_refs=prompt.media_refs,
            kv_transfer_params_json=kv_transfer.to_engine(request.kv_transfer_params),
        )
        # The pixels go out as fields appended to the serialized request, never copied into it.
        return ChatRun(self, request, worker, generate, prompt, by_worker, parsing, audio_inputs)

    def _media_route(self, rendered: RenderedChat) -> tuple[bool, bool]:
        """(the worker preprocesses the media, only workers taking preprocessed audio may
        serve it). Audio the gateway preprocesses goes only to workers that take it (SMG's
        servicer does not); on auto, with none in the pool, the clips go as media_refs."""
        audio = any(item.modality == "audio" for item in rendered.media)
        by_worker = self.prompts.by_worker(
            rendered, audio_inputs=not audio or self.pool.any_takes_audio_inputs()
        )
        return by_worker, audio and not by_worker

    async def _prepared(
        self,
        request: ChatCompletionRequest,
        rendered: RenderedChat,
        by_worker: bool,
        audio_inputs: bool,
        budget: bool,
    ) -> tuple[Prompt, Worker]:
        """The worker picked and the prompt made for it (media expanded or referred)."""
        pixels = self.pool.shared_pixels() if rendered.media and not by_worker else None
        if pixels is not None:
            # Preprocessed before the pick (every worker takes these pixels): cache-aware
            # routing then keys the blocks holding an item by the item's hash, as vLLM does.
            prompt = await self.prompts.expand(request, pixels, rendered)
            worker = self.pool.pick(
                prompt.ids, thinking_budget=budget, mm=prompt.mm_spans(), audio_inputs=audio_inputs
            )
            if worker.facts.pixels != pixels:  # a worker came or went meanwhile
                prompt = await self.prompts.expand(request, worker.facts.pixels, rendered)
            return prompt, worker
        worker = self.pool.pick(
            rendered.token_ids,
            media_refs=by_worker,
            thinking_budget=budget,
            audio_inputs=audio_inputs,
        )
        if by_worker:
            # Counted before anything is fetched: a video may be tens of MB.
            check_counts(_counts(rendered.media), worker.facts)
            return await self.prompts.refer(request, rendered), worker
        return await self.prompts.expand(request, worker.facts.pixels, rendered), worker

    def prepare(self, request: ChatCompletionRequest) -> None:
        """What `start` does to a request before rendering it (count_tokens renders it so)."""
        check_model(request.model, self.model_name)
        if self.transcription_only:
            raise generation_refused()
        if request.tool_choice == "none" and self.parsing.exclude_tools_when_tool_choice_none:
            request.tools = None
        request.apply_reasoning_effort()


def check_items(prompt: Prompt, facts: WorkerFacts) -> None:
    """The worker takes images, and no more per prompt than it advertises."""
    check_counts(prompt.item_counts(), facts)


def check_counts(counts: Mapping[str, int], facts: WorkerFacts) -> None:
    """`check_items` on the counts of a prompt's items by modality."""
    if not facts.supports_vision:
        raise GatewayError("the engine worker does not accept images", 400, "messages")
    for modality, count in counts.items():
        # vLLM's own processor refuses these with this message; a worker fed preprocessed
        # input may not (smg-grpc-servicer only advertises the limit), so the gateway holds
        # to it.
        limit = facts.mm_item_limits.get(modality)
        if limit is not None and count > limit:
            message = f"At most {limit} {modality}(s) may be provided in one prompt."
            raise GatewayError(message, 400, "messages")


def _counts(media: Sequence[MediaItem]) -> dict[str, int]:
    return dict(Counter(item.modality for item in media))


def _max_tokens(request: ChatCompletionRequest, prompt: Prompt, facts: WorkerFacts) -> int | None:
    requested = request.requested_max_tokens()
    param = "max_completion_tokens" if request.max_completion_tokens else "max_tokens"
    check_max_tokens(requested, facts.max_context_length, param)
    if prompt.media_refs is not None:
        # The prompt grows on the worker, which alone knows the room left: unset, the engine
        # fills the context as vLLM's server does; set, the engine stops at the context's end.
        return requested if requested is not None else facts.sampling_defaults.get("max_tokens")
    return max_tokens_for(
        requested, len(prompt.ids), facts.max_context_length, facts.sampling_defaults
    )


def _truncated(keep: int | None, prompt: Prompt, max_model_len: int) -> list[int]:
    ids = truncate_prompt(prompt.ids, keep, max_model_len)
    if prompt.has_media and len(ids) < len(prompt.ids):
        raise GatewayError(
            "truncate_prompt_tokens would cut a prompt with images", 400, "truncate_prompt_tokens"
        )
    return ids


class ChatRun:
    """One request's exchange with its worker, read as OpenAI JSON or SSE chunks."""

    def __init__(
        self,
        service: ChatService,
        request: ChatCompletionRequest,
        worker: Worker,
        generate: pb.GenerateRequest,
        prompt: Prompt,
        by_worker: bool,
        parsing: ChatParsing | None,
        audio_inputs: bool = False,
    ) -> None:
        self.service, self.request, self.parsing = service, request, parsing
        self.worker = worker  # the one first picked (its facts: the model's sampling defaults)
        self.generation = Generation(
            request,
            worker,
            generate,
            service.tokenizer,
            service.added,
            metrics=service.metrics,
            reroute=lambda failed: service.pool.reroute(
                failed,
                prompt.ids,
                by_worker,
                request.thinking_token_budget is not None,
                prompt.mm_spans(),
                audio_inputs,
            ),
            tail=service.prompts.tail(prompt),
        )
        self.choices = self.generation.choices
        self.usage = self.generation.usage
        # One parser per choice: a parser holds its sequence's streaming state.
        self._token_texts: dict[int, list[str]] = {}
        self.parsers: list[ChoiceParser | None] = [
            parsing.choice() if parsing is not None else None for _ in self.choices
        ]
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
            "usage": self._usage(self.usage.as_dict()),
            **kv_transfer.in_response(self.generation.kv_transfer_params),
        }

    def _final_choice(self, choice: Choice) -> dict:
        text = choice.text.release(finished=True)
        parser = self.parsers[choice.index]
        message: dict[str, Any] = {"role": "assistant", "content": text, **VLLM_NULLS}
        finish_reason = choice.finish_reason
        if parser is not None and self.parsing is not None:
            parsed = parser.whole(text)
            content = self.parsing.message_content(parsed.content)
            message.update(content=content, reasoning=parsed.reasoning)
            if parsed.tool_calls:
                message["tool_calls"] = [tool_call_json(c) for c in parsed.tool_calls]
            finish_reason = self.parsing.finish_reason(
                parser.called, choice.finish_reason or "stop", streamed=False
            )
            self._count_tool_calls(parser)
        return {
            "index": choice.index,
            "message": message,
            "logprobs": self._final_logprobs(choice),
            "finish_reason": finish_reason,
            "stop_reason": choice.stop_reason,
        }

    def _count_tool_calls(self, parser: ChoiceParser) -> None:
        name = self.service.parsing.tool_call_parser
        if name is None:
            return
        metrics = self.service.metrics
        if parser.call_count:
            metrics.tool_calls.labels(name).inc(parser.call_count)
        if parser.failed:
            metrics.tool_parse_failures.labels(name).inc()

    def _final_logprobs(self, choice: Choice) -> dict | None:
        # vLLM hides logprobs (token texts) along with the reasoning they would reveal.
        if not self.request.logprobs or self._hides_reasoning:
            return None
        return chat_logprobs(self.service.token_texts, choice.logprobs, self._top)

    @property
    def _hides_reasoning(self) -> bool:
        return self.parsing is not None and not self.request.include_reasoning

    def _usage(self, usage: dict) -> dict:
        if self.parsing is not None and self.parsing.has_reasoning:
            tokens = sum(self._reasoning_tokens(c) for c in self.choices)
            usage["completion_tokens_details"] = {"reasoning_tokens": tokens}
        return usage

    def _reasoning_tokens(self, choice: Choice) -> int:
        parser = self.parsers[choice.index]
        if parser is None:
            return 0
        # Tokens decoded one by one, kept: continuous usage asks again after every event.
        texts = self._token_texts.setdefault(choice.index, [])
        decode = self.service.tokenizer.decode
        ids = choice.text.token_ids
        del texts[len(ids) :]  # a stop string can cut ids off the end
        texts += [decode([i], skip_special_tokens=False) for i in ids[len(texts) :]]
        return parser.reasoning_tokens(texts, self.service.vocab.special_tokens)

    async def sse(self) -> AsyncIterator[str]:
        async for batch in self._chunk_batches():
            # What arrived together is written together (fewer, larger writes under load).
            yield "".join(self._event(choices, usage) for choices, usage in batch)

    async def chunks(self) -> AsyncIterator[Chunk]:
        """The stream's chunks as (choices, usage), the dicts `sse` writes."""
        async for batch in self._chunk_batches():
            for chunk in batch:
                yield chunk

    async def _chunk_batches(self) -> AsyncIterator[list[Chunk]]:
        options = self.request.stream_options
        usage_at_end = bool(options and options.include_usage)
        continuous = bool(options and options.continuous_usage_stats)
        for choice in self.choices:
            first = {
                "index": choice.index,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
            yield [([first], None)]
        async for batch in self.generation.batches():
            chunks = [self._delta_chunk(c, done, continuous) for c, done in per_choice(batch)]
            if present := [c for c in chunks if c is not None]:
                yield present
        if usage_at_end:
            yield [([], self._usage(self.usage.as_dict()))]

    def _delta_chunk(self, choice: Choice, finished: bool, continuous: bool) -> Chunk | None:
        delta, finish_reason = self._delta(choice, finished)
        logprobs = self._stream_logprobs(choice)
        if self._hides_reasoning:
            logprobs = []
        if not delta and not finished and not logprobs:
            return None
        entry = {
            "index": choice.index,
            "delta": delta,
            "logprobs": {"content": logprobs} if logprobs else None,
            "finish_reason": finish_reason if finished else None,
        }
        if finished:
            entry["stop_reason"] = choice.stop_reason
        return [entry], self._running_usage() if continuous else None

    def _delta(self, choice: Choice, finished: bool) -> tuple[dict, str | None]:
        parser = self.parsers[choice.index]
        if parser is None or self.parsing is None:
            text = choice.text.release(finished=finished)
            return ({"content": text} if text else {}), choice.finish_reason
        # The parser sees the text token by token, as vLLM's does (it tells markers apart
        # by the delta they arrive in), and once more at the end to flush held text.
        pieces = choice.text.release_pieces(finished=finished)
        messages = [parser.delta(piece, False) for piece in pieces]
        if finished:
            messages.append(parser.delta("", True))
            self._count_tool_calls(parser)
        reason = self.parsing.finish_reason(
            parser.called, choice.finish_reason or "stop", streamed=True
        )
        return delta_json(merged(messages)), reason

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
        usage = Usage(self.usage.prompt_tokens, self.usage.cached_tokens, generated)
        return self._usage(usage.as_dict())

    def _event(self, choices: list[dict], usage: dict | None = None) -> str:
        return self._writer.chunk(choices, usage)
