"""Stored responses read back: GET, DELETE, GET .../input_items and POST .../cancel on
/v1/responses/{response_id}.

vLLM serves GET and cancel with these messages; DELETE and input_items are OpenAI's (vLLM has
neither), in OpenAI's shapes.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from gateway.api.responses.background import BackgroundRuns
from gateway.api.responses.store import ResponseStore, StoredResponse
from gateway.errors import GatewayError
from gateway.stream import sse

RUNNING = ("queued", "in_progress")


class ResponseRef(BaseModel):
    response_id: str


class RetrieveParams(ResponseRef):
    # vLLM's: a background streamed response's events again, after the sequence number
    # `starting_after` (all without it), and on as they come while it runs.
    stream: bool = False
    starting_after: int | None = Field(default=None, ge=0)


class InputItemsParams(ResponseRef):
    """OpenAI's list parameters."""

    after: str | None = None
    limit: int = Field(default=20, ge=1, le=100)
    order: Literal["asc", "desc"] = "desc"


class StoredResponses:
    """The read side of the response store, with the background runs it can stop."""

    def __init__(self, store: ResponseStore, background: BackgroundRuns) -> None:
        self.store, self.background = store, background

    async def retrieve(self, params: RetrieveParams) -> dict[str, Any] | StreamingResponse:
        stored = await self._stored(params.response_id)
        if not params.stream:
            return stored.response
        events = self.background.events(params.response_id)
        if events is None:  # not a streamed background response (or long finished)
            message = f"Unknown response_id: {params.response_id}"
            raise GatewayError(message, 400, "response_id")
        return sse.event_stream(events.follow(params.starting_after), done=None)

    async def delete(self, ref: ResponseRef) -> dict[str, Any]:
        await self._stored(ref.response_id)
        await self.background.cancel(ref.response_id)  # a deleted response stops running
        await self.store.delete(ref.response_id)
        return {"id": ref.response_id, "object": "response", "deleted": True}

    async def input_items(self, params: InputItemsParams) -> dict[str, Any]:
        items = (await self._stored(params.response_id)).input_items
        ordered = items if params.order == "asc" else items[::-1]
        if params.after is not None:
            ids = [item.get("id") for item in ordered]
            if params.after not in ids:
                raise GatewayError(f"No input item with id '{params.after}'.", 404, "after")
            ordered = ordered[ids.index(params.after) + 1 :]
        page = ordered[: params.limit]
        return {
            "object": "list",
            "data": page,
            "first_id": page[0].get("id") if page else None,
            "last_id": page[-1].get("id") if page else None,
            "has_more": len(ordered) > len(page),
        }

    async def cancel(self, ref: ResponseRef) -> dict[str, Any]:
        stored = await self._stored(ref.response_id)
        if stored.response.get("status") not in RUNNING:
            raise GatewayError(
                "Cannot cancel a synchronous response.",
                400,
                "response_id",
                error_type="invalid_request_error",
            )
        await self.background.cancel(ref.response_id)
        # The run saves itself as cancelled when stopped; one that had not started yet, or
        # that ended as it was cancelled, is marked here.
        stored = await self._stored(ref.response_id)
        if stored.response.get("status") in RUNNING:
            stored.response["status"] = "cancelled"
            await self.store.put(ref.response_id, stored)
        return stored.response

    async def _stored(self, response_id: str) -> StoredResponse:
        stored = await self.store.get(response_id)
        if stored is None:
            raise GatewayError(
                f"Response with id '{response_id}' not found.",
                404,
                "response_id",
                error_type="invalid_request_error",
            )
        return stored
