"""Where stored responses live: the interface every store implements.

A continuation (`previous_response_id`) replays every earlier item, so a stored response keeps
the chat messages its turn was rendered from (earlier turns included) beside the Response
object a client sees. The interface is async so that a store shared by several gateway
replicas (Redis, a database) can sit behind it; `gateway.api.responses.memory_store` is the
in-process one, bounded in bytes and age, and `sqlite_store` the one the processes of one
gateway (`--api-server-count N`) share, with the same bounds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class StoredResponse:
    # The Response object as GET /v1/responses/{id} returns it (status, output, usage, ...).
    response: dict[str, Any]
    # The request's input items with their ids, as GET /v1/responses/{id}/input_items lists them.
    input_items: list[dict[str, Any]] = field(default_factory=list)
    # The chat messages this turn was rendered from, without the system message (instructions
    # are not carried over, as OpenAI and vLLM): earlier turns' replayed messages, then this
    # turn's input. A continuation appends this response's output items as messages.
    messages: list[dict[str, Any]] = field(default_factory=list)


class ResponseStore(Protocol):
    async def put(self, response_id: str, stored: StoredResponse) -> None:
        """Keep (or replace) a response; a store over its bounds evicts the oldest first."""
        ...

    async def get(self, response_id: str) -> StoredResponse | None:
        """The response, or None when it was never stored, was deleted or was evicted."""
        ...

    async def delete(self, response_id: str) -> bool:
        """Forget a response; False when there was none."""
        ...
