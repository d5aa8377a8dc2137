"""POST /v1/messages and /v1/messages/count_tokens on the chat path.

Errors as vLLM gives them: a body that does not validate is OpenAI's 400 (vLLM's request
validation answers before its Anthropic handler runs, e.g. for a missing max_tokens); anything
refused after that (the chat request's checks, an unknown model, a bad image, a worker's
refusal) is Anthropic's {"type": "error", "error": {"type", "message"}} with its status, and a
stream that fails once started ends with Anthropic's error event.
"""

from __future__ import annotations

from typing import Any

import jinja2
import jinja2.ext
import jinja2.sandbox
from fastapi.responses import JSONResponse, Response

from gateway.api.chat import ChatService
from gateway.api.messages.convert import DisabledEffort, to_chat_request
from gateway.api.messages.events import anthropic_error, error_event, message_events
from gateway.api.messages.protocol import (
    EFFORTS,
    CountTokensRequest,
    MessagesRequest,
    PromptFields,
)
from gateway.api.messages.reply import to_message
from gateway.api.protocol import ChatCompletionRequest
from gateway.errors import MmgateError, parse_body
from gateway.observability import tracing
from gateway.render.templates import select_template
from gateway.stream import sse
from multimodal.pipeline import PixelEncoding

# Token ids do not depend on the pixel encoding; uint8 is the cheapest to produce.
_IDS_ONLY = PixelEncoding(raw=True)


class MessagesService:
    def __init__(self, chat: ChatService) -> None:
        self.chat = chat
        self._merge_inline_system: bool | None = None
        self._disabled_effort: DisabledEffort | None = None

    async def create(self, body: Any) -> Response:
        with tracing.span("mmgate.render"):
            request = parse_body(MessagesRequest, body)
        try:
            run = await self.chat.start(self._chat_request(request))
            if request.stream:
                events = message_events(
                    run.chunks(), run.id, self.chat.model_name, lambda: run.usage.prompt_tokens
                )
                return sse.event_stream(events, done=None, error=error_event)
            return JSONResponse(to_message(await run.complete()))
        except MmgateError as error:
            return error_response(error)

    async def count_tokens(self, body: Any) -> Response | dict:
        """The prompt's tokens as create renders it (every tool, whatever the choice), images
        expanded: create's input_tokens."""
        request = parse_body(CountTokensRequest, body)
        try:
            chat_request = self._chat_request(request)
            self.chat.prepare(chat_request)
            tokens = len((await self.chat.prompts.build(chat_request, _IDS_ONLY)).ids)
        except MmgateError as error:
            return error_response(error)
        return {"input_tokens": tokens, "context_management": {"original_input_tokens": tokens}}

    def _chat_request(self, request: PromptFields) -> ChatCompletionRequest:
        disabled: DisabledEffort = "none"
        if request.thinking is not None and request.thinking.type == "disabled":
            disabled = self.disabled_thinking_effort()
        return to_chat_request(
            request,
            merge_inline_system=self.merge_inline_system(),
            disabled_effort=disabled,
        )

    def merge_inline_system(self) -> bool:
        """Whether the template wants the system message first only (it raises on a later one,
        as Qwen's `loop.first` guard does): then inline system messages join the leading one.
        vLLM probes the template with and without tools, once."""
        if self._merge_inline_system is None:
            renderer = self.chat.prompts.renderer
            templates = [
                select_template(renderer.files.templates, renderer.chat_template, tools)
                for tools in (None, [])
            ]
            self._merge_inline_system = any(map(_wants_system_first, templates))
        return self._merge_inline_system

    def disabled_thinking_effort(self) -> DisabledEffort:
        """What thinking {"type": "disabled"} sends as reasoning_effort: "none", unless the
        template renders "none" as it renders a thinking effort or refuses it, then "low"
        (vLLM's probe, on a one-message chat)."""
        if self._disabled_effort is None:
            none = self._probe("none")
            same = none is None or any(self._probe(e) == none for e in EFFORTS)
            self._disabled_effort = "low" if same else "none"
        return self._disabled_effort

    def _probe(self, effort: str) -> list[int] | None:
        request = ChatCompletionRequest(
            messages=[{"role": "user", "content": "Hi"}],
            reasoning_effort=effort,  # type: ignore[arg-type]
        )
        request.apply_reasoning_effort()
        try:
            return self.chat.prompts.render(request).token_ids
        except MmgateError:
            return None


def _wants_system_first(template: str | None) -> bool:
    if not template:
        return True
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    conversation = [{"role": r, "content": "t"} for r in ("system", "user", "system", "user")]
    try:
        env.from_string(template).render(messages=conversation, add_generation_prompt=False)
    except jinja2.TemplateError:
        return True
    return False


def error_response(error: MmgateError) -> JSONResponse:
    return JSONResponse(anthropic_error(error.message, error.status, error.param), error.status)
