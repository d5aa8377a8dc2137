"""Server-sent events for streamed completions.

Every chunk of a response repeats id, object, created and model; they are encoded once per
response instead of once per token (the stream's per-token cost is what a gateway is judged by).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

from fastapi.responses import StreamingResponse

from gateway.errors import MmgateError, error_body
from gateway.observability import tracing

DONE = "data: [DONE]\n\n"
log = logging.getLogger("mmgate.gateway")


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def data(body: Any) -> str:
    return f"data: {dumps(body)}\n\n"


class ChunkWriter:
    def __init__(self, id: str, object: str, created: int, model: str) -> None:  # noqa: A002
        fixed = dumps({"id": id, "object": object, "created": created, "model": model})
        self._head = f'data: {fixed[:-1]}, "choices": '

    def chunk(self, choices: list[dict], usage: dict | None = None) -> str:
        """The same text as data({...fixed, "choices": choices[, "usage": usage]})."""
        tail = f', "usage": {dumps(usage)}' if usage is not None else ""
        return f"{self._head}{dumps(choices)}{tail}}}\n\n"


# How a stream writes an error that ends it: OpenAI's body as a data line, by default.
ErrorEvent = Callable[[str, int, "str | None"], str]


def _openai_error(message: str, status: int, param: str | None) -> str:
    return data(error_body(message, status, param))


def named(event: str, body: Any) -> str:
    """An SSE event with its type line, as the Responses and Messages APIs write them."""
    return f"event: {event}\ndata: {dumps(body)}\n\n"


async def _framed(
    events: AsyncIterator[str], done: str | None = DONE, error: ErrorEvent = _openai_error
) -> AsyncIterator[str]:
    """`events`, then `done` ([DONE] for chat and completions, nothing for the Responses and
    Messages APIs). A failure ends the stream with an error event before `done` (a bug too:
    the client gets a clean end, never a cut connection)."""
    streaming, failure = tracing.start("mmgate.stream"), None
    try:
        async with aclosing(events) as stream:
            async for event in stream:
                yield event
    except MmgateError as refused:
        failure = refused
        yield error(refused.message, refused.status, refused.param)
    except Exception as bug:
        failure = bug
        log.exception("a streamed response failed")
        yield error("internal error while streaming", 500, None)
    finally:
        tracing.finish(streaming, failure)
    if done is not None:
        yield done


def event_stream(
    events: AsyncIterator[str], done: str | None = DONE, error: ErrorEvent = _openai_error
) -> StreamingResponse:
    return StreamingResponse(_framed(events, done, error), media_type="text/event-stream")
