"""Anthropic Messages request bodies, with vLLM's fields, defaults and checks
(`vllm/entrypoints/anthropic/protocol.py`). Unknown fields are ignored, as vLLM (and Anthropic's
SDK upgrades) expect; vLLM's extensions it passes on to chat (`chat_template_kwargs`,
`kv_transfer_params`, `cache_salt`, ...) are passed on the same way, so the chat request accepts
or refuses them as /v1/chat/completions does."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

# vLLM's VLLM_MAX_STOP_STRINGS default.
MAX_STOP_STRINGS = 4
BILLING_HEADER = "x-anthropic-billing-header"


class ToolChangeReference(BaseModel):
    type: Literal["tool_reference"]
    name: str


class Tool(BaseModel):
    name: str
    description: str | None = None
    input_schema: dict[str, Any]
    strict: bool | None = None
    defer_loading: bool | None = None

    @field_validator("input_schema")
    @classmethod
    def _object_by_default(cls, schema: dict[str, Any]) -> dict[str, Any]:
        schema.setdefault("type", "object")
        return schema


class ToolChangeDefinition(BaseModel):
    type: Literal["tool_definition"]
    definition: Tool


ToolChange = Annotated[ToolChangeReference | ToolChangeDefinition, Field(discriminator="type")]
TOOL_CHANGES = ("tool_addition", "tool_removal")


class ContentBlock(BaseModel):
    type: Literal[
        "text",
        "image",
        "tool_use",
        "tool_result",
        "tool_reference",
        "thinking",
        "redacted_thinking",
        "tool_addition",
        "tool_removal",
    ]
    text: str | None = None
    source: dict[str, Any] | None = None  # image
    id: str | None = None  # tool_use
    tool_use_id: str | None = None  # tool_result
    name: str | None = None
    input: dict[str, Any] | None = None
    content: str | list[dict[str, Any]] | None = None
    is_error: bool | None = None
    tool_name: str | None = None  # tool_reference
    thinking: str | None = None
    signature: str | None = None
    data: str | None = None  # redacted_thinking
    tool: ToolChange | None = None  # tool_addition / tool_removal

    @model_validator(mode="after")
    def _tool_change(self) -> ContentBlock:
        if self.type not in TOOL_CHANGES:
            return self
        if self.tool is None:
            raise ValueError(f"tool is required for {self.type} blocks")
        if self.type == "tool_removal" and self.tool.type != "tool_reference":
            raise ValueError("tool_removal only accepts a tool_reference")
        return self


def _reject_tool_changes(content: str | list[ContentBlock] | None) -> None:
    if content is None or isinstance(content, str):
        return
    for block in content:
        if block.type in TOOL_CHANGES:
            raise ValueError(f'{block.type} blocks are only allowed in messages with role "system"')


class Message(BaseModel):
    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]

    @model_validator(mode="after")
    def _changes_only_in_system(self) -> Message:
        if self.role != "system":
            _reject_tool_changes(self.content)
        return self


class ToolChoice(BaseModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _named(self) -> ToolChoice:
        if self.type == "tool" and not self.name:
            raise ValueError("tool_choice.name is required when type is 'tool'")
        return self


class JsonOutputFormat(BaseModel):
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    type: Literal["json_schema"] = "json_schema"


Effort = Literal["low", "medium", "high", "xhigh", "max"]
EFFORTS: tuple[str, ...] = ("low", "medium", "high", "xhigh", "max")


class OutputConfig(BaseModel):
    effort: Effort | None = None
    format: JsonOutputFormat | None = None


Display = Literal["summarized", "omitted", "updates"]


class ThinkingEnabled(BaseModel):
    type: Literal["enabled"]
    budget_tokens: int = Field(ge=1024)
    display: Display | None = None  # accepted and ignored, as vLLM: reasoning always returns


class ThinkingDisabled(BaseModel):
    type: Literal["disabled"]


class ThinkingAdaptive(BaseModel):
    type: Literal["adaptive"]
    display: Display | None = None


Thinking = Annotated[
    ThinkingEnabled | ThinkingDisabled | ThinkingAdaptive, Field(discriminator="type")
]


class PromptFields(BaseModel):
    """What create and count_tokens share: what the prompt is rendered from."""

    model: str
    messages: list[Message]
    system: str | list[ContentBlock] | None = None
    output_config: OutputConfig | None = None
    thinking: Thinking | None = None
    tool_choice: ToolChoice | None = None
    tools: list[Tool] | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("model")
    @classmethod
    def _model_given(cls, model: str) -> str:
        if not model:
            raise ValueError("Model is required")
        return model

    @field_validator("system")
    @classmethod
    def _system(cls, system: str | list[ContentBlock] | None) -> str | list[ContentBlock] | None:
        _reject_tool_changes(system)
        return system


class MessagesRequest(PromptFields):
    """POST /v1/messages."""

    max_tokens: int
    metadata: dict[str, Any] | None = None  # accepted, unused (as vLLM)
    stop_sequences: Annotated[list[str], Field(max_length=MAX_STOP_STRINGS)] | None = None
    stream: bool | None = False
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    # vLLM's extensions, handed to the chat request (which refuses what mmgate does not do).
    cache_salt: str | None = None
    watermarking: bool | None = None
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    vllm_xargs: dict[str, Any] | None = None

    @field_validator("max_tokens")
    @classmethod
    def _positive(cls, max_tokens: int) -> int:
        if max_tokens <= 0:
            raise ValueError("max_tokens must be positive")
        return max_tokens

    @model_validator(mode="after")
    def _budget_below_max_tokens(self) -> MessagesRequest:
        # P/D prefill legs are sent with max_tokens=1 and never decode (vLLM's exception).
        if self.kv_transfer_params and self.kv_transfer_params.get("do_remote_decode"):
            return self
        thinking = self.thinking
        if isinstance(thinking, ThinkingEnabled) and thinking.budget_tokens >= self.max_tokens:
            raise ValueError("thinking.budget_tokens must be less than max_tokens")
        return self


class CountTokensRequest(PromptFields):
    """POST /v1/messages/count_tokens."""


class CountTokensResponse(BaseModel):
    input_tokens: int
    context_management: dict[str, int] | None = None
