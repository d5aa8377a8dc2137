"""Per-choice accumulation of a worker's Generate stream into OpenAI text, finish and usage.

The worker streams delta token ids per choice and then a Complete per choice that repeats
the last delta (it is not counted again). A token that could end the request (EOS, a stop
token id) is held back for one message, until the Complete tells whether it did: vLLM
leaves such a token out of the text.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Protocol

from tokenizers import Tokenizer

from gateway.errors import GatewayError
from gateway.observability.metrics import GatewayMetrics
from gateway.ratelimit.usage import charge_generated
from gateway.stream.detokenizer import IncrementalText, TextOptions
from gateway.stream.logprobs import Position
from gateway.workers.retry import Reroute, RetryingGenerate
from gateway.workers.tensor_transport import Tail
from gateway.workers.worker import Worker
from multimodal.wire import Piece
from protos import extensions
from protos import vllm_engine_pb2 as pb


class TextRequest(Protocol):
    """What a generation reads of a request (the API's sampling fields): how its text is
    made and where it stops."""

    n: int
    skip_special_tokens: bool
    spaces_between_special_tokens: bool
    include_stop_str_in_output: bool
    min_tokens: int
    stop_token_ids: list[int] | None
    ignore_eos: bool
    thinking_token_budget: int | None

    def stop_list(self) -> list[str]: ...


@dataclass
class Choice:
    index: int
    text: IncrementalText
    stop_ids: Collection[int]
    held: int | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    generated: int = 0
    logprobs: list[Position] = field(default_factory=list)
    logprobs_sent: int = 0

    def on_chunk(self, chunk: pb.GenerateStreamChunk) -> None:
        self._take(list(chunk.token_ids), chunk.output_logprobs)

    def _take(self, ids: list[int], logprobs: pb.OutputLogProbs) -> None:
        self.generated += len(ids)
        self._collect_logprobs(logprobs)
        if self.held is not None:
            ids.insert(0, self.held)
            self.held = None
        if ids and ids[-1] in self.stop_ids:
            self.held = ids.pop()
        self.text.update(ids)

    def on_complete(self, complete: pb.GenerateComplete, whole: bool = False) -> None:
        """`whole`: a non-streamed call, whose Complete carries every token (otherwise it
        repeats the last delta, already taken)."""
        if whole:
            self._take(list(complete.output_ids), complete.output_logprobs)
        self.finish_reason = complete.finish_reason or "stop"
        kind = complete.WhichOneof("matched_stop")
        self.stop_reason = getattr(complete, kind) if kind else None
        if self.held is not None:
            by_token = self.finish_reason == "stop" and kind != "matched_stop_str"
            self.text.update([self.held], stop_terminated=by_token)
            self.held = None

    def _collect_logprobs(self, proto: pb.OutputLogProbs) -> None:
        if not proto.token_ids:  # no logprobs asked for: the usual case, once per chunk
            return
        tops = list(proto.top_logprobs) or [None] * len(proto.token_ids)
        for token, value, top in zip(proto.token_ids, proto.token_logprobs, tops):
            alternatives = tuple(zip(top.token_ids, top.values)) if top is not None else ()
            self.logprobs.append(Position(token, value, alternatives))

    def unsent_logprobs(self) -> tuple[list[Position], list[int]]:
        """Positions not yet streamed, and the sampled tokens just before them."""
        start = self.logprobs_sent
        self.logprobs_sent = len(self.logprobs)
        context = [p.token for p in self.logprobs[max(0, start - 4) : start]]
        return self.logprobs[start:], context


_END = object()


def per_choice(batch: list[tuple[Choice, bool]]) -> list[tuple[Choice, bool]]:
    """Each choice of a batch once, in order of first appearance, finished if any item was."""
    seen: dict[int, tuple[Choice, bool]] = {}
    for choice, finished in batch:
        previous = seen.get(choice.index)
        seen[choice.index] = (choice, finished or (previous is not None and previous[1]))
    return list(seen.values())


@dataclass
class Usage:
    prompt_tokens: int
    cached_tokens: int = 0
    completion_tokens: int = 0

    def as_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }


def make_choices(
    n: int,
    tokenizer: Tokenizer,
    prompt_ids: Sequence[int],
    options: TextOptions,
    added: Mapping[int, str],
    stop_ids: Collection[int],
) -> list[Choice]:
    return [
        Choice(i, IncrementalText(tokenizer, prompt_ids, options, added), stop_ids)
        for i in range(n)
    ]


class Generation:
    """One GenerateRequest's exchange with its worker, accumulated per choice."""

    def __init__(
        self,
        request: TextRequest,
        worker: Worker,
        generate: pb.GenerateRequest,
        tokenizer: Tokenizer,
        added: Mapping[int, str],
        first_index: int = 0,
        metrics: GatewayMetrics | None = None,
        reroute: Reroute | None = None,
        tail: Tail | Sequence[Piece] = (),
        metadata: Sequence[tuple[str, str]] = (),
    ) -> None:
        """`tail`: fields already serialized, sent after `generate`'s own (the images), or
        what makes them for each worker tried (gateway.workers.tensor_transport); `metadata`:
        more of the call's (protos/extensions.py), for a worker that advertised it."""
        options = TextOptions(
            skip_special_tokens=request.skip_special_tokens,
            spaces_between_special_tokens=request.spaces_between_special_tokens,
            stop=tuple(request.stop_list()),
            include_stop_str_in_output=request.include_stop_str_in_output,
            min_tokens=request.min_tokens,
        )
        stop_ids = set(request.stop_token_ids or ())
        if not request.ignore_eos:
            # Held too: every added token, because a worker's EOS list can be short of what
            # its engine stops on (smg-grpc-servicer reports only the HF config's top-level
            # eos_token_id: none for Qwen2-VL, and not generation_config.json's extras). EOS
            # ids are added tokens; holding another one only delays it by one message.
            stop_ids |= set(worker.facts.eos_token_ids) | added.keys()
        prompt_ids = generate.tokenized.input_ids  # read, never copied whole (800 ids: 30 us)
        self.choices = make_choices(request.n, tokenizer, prompt_ids, options, added, stop_ids)
        for choice in self.choices:
            choice.index += first_index
        self.usage = Usage(prompt_tokens=len(prompt_ids))
        self.generate = generate
        # The budget is not in the proto: it travels in the call's metadata, to a worker that
        # advertised it (the caller picked one, and reroutes only to one).
        metadata = (*extensions.thinking_budget_metadata(request.thinking_token_budget), *metadata)
        self.call = RetryingGenerate(worker, generate, tail, reroute, metadata, metrics)
        # What the engine's KV connector returned (disaggregated prefill: the handoff)
        self.kv_transfer_params: dict | None = None
        self.metrics = metrics
        self._sent_at = self._first_token_at = 0.0

    async def responses(self) -> AsyncIterator[tuple[Choice, bool]]:
        """(choice, finished) after each message from the worker. A call that fails for the
        worker's fault before any message is retried on another worker, if the pool has one."""
        self._sent_at = time.perf_counter()
        async with aclosing(self.call.responses()) as responses:
            async for response in responses:
                for item in self._on_response(response):
                    yield item
        if unfinished := [c.index for c in self.choices if c.finish_reason is None]:
            raise GatewayError(
                f"the engine worker ended the stream before finishing choice {unfinished[0]}",
                502,
            )
        self.usage.completion_tokens = sum(c.generated for c in self.choices)
        self._observe()

    async def batches(self) -> AsyncIterator[list[tuple[Choice, bool]]]:
        """responses(), read ahead by a task: all that arrived while the caller was busy comes
        as one batch, so a busy stream is written in fewer, larger pieces. When a batch is
        handed out, the choices' state is that after its last item."""
        queue: asyncio.Queue = asyncio.Queue()

        async def pump() -> None:
            try:
                async for item in self.responses():
                    queue.put_nowait(item)
                queue.put_nowait(_END)
            except Exception as error:  # noqa: BLE001 - re-raised on the caller's side
                queue.put_nowait(error)

        task = asyncio.create_task(pump())
        try:
            while True:
                items = [await queue.get()]
                while not queue.empty():
                    items.append(queue.get_nowait())
                done = items[-1] is _END or isinstance(items[-1], Exception)
                batch = [item for item in items if isinstance(item, tuple)]
                if batch:
                    yield batch
                if isinstance(items[-1], Exception):
                    raise items[-1]
                if done:
                    return
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def _on_response(self, response: pb.GenerateResponse) -> list[tuple[Choice, bool]]:
        if response.HasField("chunk"):
            if not self._first_token_at and response.chunk.token_ids:
                self._first_token_at = time.perf_counter()
            self.usage.cached_tokens = response.chunk.cached_tokens
            # The engine's count: a prompt whose media the worker preprocessed grew there.
            self.usage.prompt_tokens = response.chunk.prompt_tokens or self.usage.prompt_tokens
            choice = self._choice(response.chunk.index)
            choice.on_chunk(response.chunk)
            charge_generated(len(response.chunk.token_ids))
            return [(choice, False)]
        if response.HasField("complete"):
            complete = response.complete
            choice = self._choice(complete.index)
            if not self.generate.stream:
                self.usage.cached_tokens = complete.cached_tokens
            self.usage.prompt_tokens = complete.prompt_tokens or self.usage.prompt_tokens
            choice.on_complete(complete, whole=not self.generate.stream)
            if not self.generate.stream:  # (a stream's Complete repeats its last delta)
                charge_generated(len(complete.output_ids))
            if complete.HasField("kv_transfer_params_json"):
                self.kv_transfer_params = _json_object(complete.kv_transfer_params_json)
            return [(choice, True)]
        return []

    def _choice(self, index: int) -> Choice:
        if not 0 <= index < len(self.choices):
            raise GatewayError(f"the engine worker sent an unknown choice index {index}", 502)
        return self.choices[index]

    def _observe(self) -> None:
        if self.metrics is None:
            return
        # Token timings exist only for streamed calls; a final-only reply brings every token at
        # once, so its TTFT would be its whole duration and its TPOT zero.
        first = self._first_token_at if self.generate.stream else 0.0
        self.metrics.observe_generation(
            ttft=first - self._sent_at if first else None,
            decode_seconds=time.perf_counter() - first if first else 0.0,
            output_tokens=self.usage.completion_tokens,
            longest_choice=max((c.generated for c in self.choices), default=0),
            prompt_tokens=self.usage.prompt_tokens,
        )

    async def run(self) -> Generation:
        async for _ in self.responses():
            pass
        return self


def _json_object(text: str) -> dict:
    """A worker's JSON object field (the KV connector's params), or a 502 naming it."""
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise GatewayError(
            "the engine worker sent kv_transfer_params_json that is not a JSON object", 502
        )
    return value
