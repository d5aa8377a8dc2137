"""POST /v1/responses: a Responses request becomes a chat request (as vLLM renders it: its
input items as chat messages through the chat template), runs on the chat path
(`ChatService.start`), and its chat result becomes a Response or the Responses stream.

Where a client sees mmgate differ from vLLM 0.32, deliberately:
- A continuation (`previous_response_id`) replays every earlier item: the stored turn's
  messages, then the previous response's output items (reasoning, message text, function
  calls with their call ids) as messages, then the new input. vLLM replays only the previous
  output's message text (vLLM issue 43244), so a function_call_output answers a call its
  prompt no longer holds. The prompt, and so the reply and `usage.input_tokens`, differ.
- `store` is honoured (OpenAI's default, true) in a store bounded in bytes and age; vLLM
  stores only with VLLM_ENABLE_RESPONSES_API_STORE=1, unbounded, and otherwise ignores it.
- A background run is stored `queued`, then `in_progress` while it generates, then
  `completed` / `incomplete` / `cancelled` / `failed`; vLLM's non-streamed background run
  stays `queued` until it ends.
- Only function tools: OpenAI's hosted tools (web search, file search, MCP, ...), custom and
  namespace tools are a 400 naming `tools`, where vLLM without a tool server drops them.
- A streamed text delta carries the logprobs of the tokens that arrived with it from the
  worker (several when they arrive together: the thought's last tokens or the EOS among
  them); vLLM's carries one engine step's. Whole responses carry vLLM's logprobs exactly
  (every generated token's, reasoning and EOS included, as vLLM).
- `usage.input_tokens_details.cache_write_tokens` is 0 (not reported by the worker).
Everything else a client reads (items, their order and shapes, texts, tool names and
arguments, statuses, usage, the event sequence) is vLLM's; tests/e2e/gateway/apis/
test_responses.py compares them with vLLM's server.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse

from gateway.api.chat import ChatRun, ChatService
from gateway.api.protocol import ChatCompletionRequest
from gateway.api.responses import items, output
from gateway.api.responses.background import BackgroundRuns, EventLog
from gateway.api.responses.events import StreamEvents
from gateway.api.responses.protocol import ResponsesRequest
from gateway.api.responses.store import ResponseStore, StoredResponse
from gateway.api.sampling import OPENAI_DEFAULTS
from gateway.errors import GatewayError, MmgateError, parse_body
from gateway.observability import tracing
from gateway.stream import sse

# vLLM's words when the store is off (it needs VLLM_ENABLE_RESPONSES_API_STORE).
NO_STORE_BACKGROUND = (
    "This gateway does not store responses and therefore does not support the background mode."
)


class ResponsesService:
    def __init__(
        self,
        chat: ChatService,
        store: ResponseStore | None,
        background: BackgroundRuns | None = None,
    ) -> None:
        """`store`: where responses are kept (None: `store` is ignored, as vLLM ignores it
        without its store; then neither `background` nor `previous_response_id` work).
        `background`: the runs of `background=true` requests (the cancel route stops them)."""
        self.chat = chat
        self.store = store
        self.background = background or BackgroundRuns()

    async def create(self, body: Any) -> JSONResponse | StreamingResponse:
        with tracing.span("mmgate.render"):
            request = parse_body(ResponsesRequest, body)
        if self.store is None:
            if request.background:
                raise GatewayError(NO_STORE_BACKGROUND, 400, "background")
            request.store = False
        history = await self._history(request.previous_response_id)
        messages = items.input_messages(request.instructions, request.input, history)
        run = await self.chat.start(to_chat_request(request, messages))
        turn = _Turn(self, request, run, messages)
        if request.background and request.stream:
            return await turn.streamed_in_background()
        if request.background:
            return JSONResponse(await turn.in_background())
        if request.stream:
            events = StreamEvents()
            return sse.event_stream(turn.sse(events), done=None, error=_error_event(events))
        return JSONResponse(await turn.whole())

    async def _history(self, previous_id: str | None) -> list[dict]:
        """The messages a continuation replays: the previous turn's, then its output."""
        if previous_id is None:
            return []
        previous = await self.store.get(previous_id) if self.store is not None else None
        if previous is None:
            raise GatewayError(
                f"Response with id '{previous_id}' not found.",
                404,
                "response_id",
                error_type="invalid_request_error",
            )
        return [*previous.messages, *items.to_messages(previous.response["output"])]


def to_chat_request(request: ResponsesRequest, messages: list[dict]) -> ChatCompletionRequest:
    """The chat request vLLM's Responses path amounts to for `request` rendered as
    `messages`. Tokenized with the tokenizer's special tokens, as vLLM's Responses path
    tokenizes (its chat path does not): a tokenizer that adds a BOS gets it once more after
    the template's, as in vLLM, so the prompt (and `usage.input_tokens`) is vLLM's."""
    logprobs = request.include_logprobs()
    continues = items.continues_final_message(request.input)
    fields: dict[str, Any] = {
        "model": request.model,
        "messages": messages,
        "add_special_tokens": True,
        "add_generation_prompt": not continues,
        "continue_final_message": continues,
        "include_reasoning": request.include_reasoning,
        "parallel_tool_calls": request.parallel_tool_calls,
        "max_tokens": request.max_output_tokens,
        "logprobs": logprobs,
        "top_logprobs": request.top_logprobs if logprobs else None,
        "stream": bool(request.stream),
        "request_id": request.request_id,
        # vLLM's truncation "auto" keeps the prompt's last tokens that fit the context.
        "truncate_prompt_tokens": -1 if request.truncation == "auto" else None,
        **_sampling(request),
        **_tools(request),
        **_constraint(request),
    }
    if request.stream:
        fields["stream_options"] = {"include_usage": True}
    if request.reasoning is not None and request.reasoning.effort is not None:
        fields["reasoning_effort"] = request.reasoning.effort
    for name in ("chat_template_kwargs", "mm_processor_kwargs", "media_io_kwargs"):
        fields[name] = getattr(request, name)
    with tracing.span("mmgate.render"):
        return parse_body(ChatCompletionRequest, {k: v for k, v in fields.items() if v is not None})


_SAMPLING = (
    "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "seed", "stop", "stop_token_ids", "ignore_eos", "logit_bias",
    "skip_special_tokens", "include_stop_str_in_output", "kv_transfer_params",
)  # fmt: skip


def _sampling(request: ResponsesRequest) -> dict[str, Any]:
    return {name: getattr(request, name) for name in _SAMPLING}


def _tools(request: ResponsesRequest) -> dict[str, Any]:
    if not request.tools:
        return {}
    tools = []
    for tool in request.tools:
        # vLLM's construct_tool_dicts: the chat tool the template sees (strict only when set).
        function = {
            "name": tool["name"],
            "description": tool.get("description"),
            "parameters": tool.get("parameters"),
        }
        if tool.get("strict") is not None:
            function["strict"] = tool["strict"]
        tools.append({"type": "function", "function": function})
    choice = request.tool_choice
    if isinstance(choice, dict):
        choice = {"type": "function", "function": {"name": choice["name"]}}
    return {"tools": tools, "tool_choice": choice}


def _constraint(request: ResponsesRequest) -> dict[str, Any]:
    """vLLM's extract_structured_outputs: text.format, or the request's structured_outputs."""
    fmt = request.text.format if request.text is not None else None
    if fmt is None:
        so = request.structured_outputs
        return {} if so is None else {"structured_outputs": so.model_dump(by_alias=True)}
    if request.structured_outputs is not None:
        raise GatewayError(
            "Cannot specify both structured_outputs and text.format", 400, "structured_outputs"
        )
    if fmt.type == "json_object":
        return {"response_format": {"type": "json_object"}}
    if fmt.type == "json_schema" and fmt.json_schema is not None:
        schema = {"name": fmt.name or "response", "schema": fmt.json_schema, "strict": fmt.strict}
        return {"response_format": {"type": "json_schema", "json_schema": schema}}
    return {}


def _error_event(events: StreamEvents) -> sse.ErrorEvent:
    def error(message: str, status: int, param: str | None) -> str:
        body = {
            "code": str(status),
            "message": message,
            "param": param,
            "sequence_number": events.sequence,
            "type": "error",
        }
        events.sequence += 1
        return sse.named("error", body)

    return error


class _Turn:
    """One request's run, as a whole Response, a stream, or in the background; stored
    when the request asks for it."""

    def __init__(
        self,
        service: ResponsesService,
        request: ResponsesRequest,
        run: ChatRun,
        messages: list[dict],
    ) -> None:
        self.service, self.request, self.run = service, request, run
        self.messages = messages
        self.created_at = int(time.time())
        # Set once a background run's response is stored as queued: from then on a save
        # never writes over a response cancelled or deleted meanwhile (by another gateway
        # process sharing the store, whose cancel reaches this run only by the store).
        self._guarded = False

    def _echo(self) -> output.Echo:
        request, defaults = self.request, self.run.worker.facts.sampling_defaults

        def chosen(name: str) -> float:
            value = getattr(request, name)
            return float(value if value is not None else defaults.get(name, OPENAI_DEFAULTS[name]))

        params = self.run.generation.generate.sampling_params
        return output.Echo(
            temperature=chosen("temperature"),
            top_p=chosen("top_p"),
            presence_penalty=chosen("presence_penalty"),
            frequency_penalty=chosen("frequency_penalty"),
            max_output_tokens=params.max_tokens if params.HasField("max_tokens") else None,
        )

    def _response(
        self, items_out: list[dict], status: str, usage: dict | None, kv: dict | None = None
    ) -> dict:
        return output.response_object(
            self.request,
            model=self.service.chat.model_name,
            created_at=self.created_at,
            echo=self._echo(),
            output=items_out,
            status=status,
            usage=usage,
            kv_transfer_params=kv,
        )

    def _finished_status(self) -> str:
        return output.status_of(self.run.choices[0].finish_reason)

    async def _save(self, response: dict) -> None:
        store = self.service.store
        if not self.request.store or store is None:
            return
        stored = StoredResponse(
            response=response,
            input_items=items.listed_items(self.request.input),
            messages=[m for m in self.messages if m.get("role") != "system"],
        )
        if self._guarded:
            current = await store.get(self.request.request_id)
            if current is None or current.response.get("status") == "cancelled":
                return
        await store.put(self.request.request_id, stored)

    async def whole(self) -> dict:
        chat = await self.run.complete()
        choice = chat["choices"][0]
        logprobs = output.response_logprobs(choice["logprobs"])
        parsed = self.run.parsing is not None
        response = self._response(
            output.output_items(choice["message"], logprobs, parsed),
            self._finished_status(),
            output.usage(chat["usage"]),
            chat.get("kv_transfer_params"),
        )
        await self._save(response)
        return response

    async def sse(self, events: StreamEvents) -> AsyncIterator[str]:
        async for batch in self._events(events):
            yield "".join(sse.named(event["type"], event) for event in batch)

    async def _events(self, events: StreamEvents) -> AsyncIterator[list[dict]]:
        yield events.started(self._response([], "in_progress", None))
        chat_usage: dict | None = None
        async for choices, usage in self.run.chunks():
            chat_usage = usage or chat_usage
            batch = []
            for choice in choices:
                logprobs = (choice.get("logprobs") or {}).get("content")
                batch += events.delta(choice["delta"], logprobs)
            if batch:
                yield batch
        if chat_usage is None:  # the chat run always ends with it (include_usage)
            raise GatewayError("the stream ended without usage", 502)
        closing = events.close()
        response = self._response(events.output, self._finished_status(), output.usage(chat_usage))
        await self._save(response)
        yield [*closing, *events.completed(response)]

    async def in_background(self) -> dict:
        """Store the response as queued, run it in a task, return the queued response."""
        queued = self._response([], "queued", None)
        await self._save(queued)
        self._guarded = True
        self.service.background.start(self.request.request_id, self._in_background(self.whole))
        return queued

    async def streamed_in_background(self) -> StreamingResponse:
        """Store the response as queued and stream it from a task: the client reads the
        events as they come, and the run goes on (and is stored) if the client leaves."""
        await self._save(self._response([], "queued", None))
        self._guarded = True
        events, log = StreamEvents(), EventLog()
        error = _error_event(events)

        async def produce() -> None:
            try:
                async for batch in self._events(events):
                    for event in batch:
                        log.append(sse.named(event["type"], event))
            except MmgateError as refused:
                log.append(error(refused.message, refused.status, refused.param))
                raise
            except Exception:
                log.append(error("internal error while streaming", 500, None))
                raise
            finally:
                log.end()

        run = self._in_background(produce)
        self.service.background.start(self.request.request_id, run, events=log)
        return sse.event_stream(log.follow(), done=None, error=error)

    async def _in_background(self, work: Callable[[], Awaitable[Any]]) -> None:
        """`work` (which stores the response when done), the response stored as in progress
        before and as cancelled (the cancel route reads it back) or failed if it ends so."""
        try:
            await self._save(self._response([], "in_progress", None))
            await work()
        except asyncio.CancelledError:
            await self._save(self._response([], "cancelled", None))
            raise
        except Exception:
            await self._save(self._response([], "failed", None))
            raise
