"""The body of `POST /v1/responses`: vLLM 0.32's ResponsesRequest for non-harmony models.

Input items stay plain dicts (`items.py` turns them into chat messages, as vLLM's
construct_input_messages does); the checks here are vLLM's own, with its messages. What this
gateway does not do is refused with a 400 naming the field, never silently ignored.
"""

from __future__ import annotations

import uuid
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator

from gateway.api.protocol import NOT_ASKED, UNSUPPORTED, StructuredOutputs, TokenId
from gateway.errors import FieldError

LOGPROBS = "message.output_text.logprobs"
# The `include` values vLLM accepts; only the logprobs one changes anything (for a model
# without built-in tools), as in vLLM.
INCLUDES = Literal[
    "code_interpreter_call.outputs",
    "computer_call_output.output.image_url",
    "file_search_call.results",
    "message.input_image.image_url",
    "message.output_text.logprobs",
    "reasoning.encrypted_content",
]


def random_id(prefix: str) -> str:
    """vLLM's ids: a prefix and 16 hex digits (its random_uuid)."""
    return f"{prefix}_{uuid.uuid4().hex[:16]}"


class Reasoning(BaseModel):
    model_config = ConfigDict(extra="allow")
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    summary: str | None = None
    generate_summary: str | None = None


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None
    description: str | None = None


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="allow")
    format: TextFormat | None = None
    verbosity: str | None = None


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    # Ordered as OpenAI documents them, then vLLM's extra fields.
    background: StrictBool | None = False
    include: list[INCLUDES] | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1, lt=2**32)
    max_tool_calls: int | None = None
    metadata: dict[str, str] | None = None
    model: str | None = None
    logit_bias: dict[str, float] | None = None
    parallel_tool_calls: StrictBool | None = True
    previous_response_id: str | None = None
    reasoning: Reasoning | None = None
    include_reasoning: StrictBool = True
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] = "auto"
    store: StrictBool | None = True
    stream: StrictBool | None = False
    temperature: float | None = None
    text: TextConfig | None = None
    tool_choice: Literal["auto", "none", "required"] | dict[str, Any] = "auto"
    tools: list[dict[str, Any]] = Field(default_factory=list)
    top_logprobs: int = Field(default=0, ge=0, le=20)
    top_p: float | None = None
    top_k: int | None = Field(default=None, lt=2**32)
    min_p: float | None = None
    truncation: Literal["auto", "disabled"] | None = "disabled"
    user: str | None = None
    skip_special_tokens: StrictBool = True
    include_stop_str_in_output: StrictBool = False
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    prompt_cache_key: str | None = None  # ignored, as vLLM ignores it
    request_id: str = Field(default_factory=lambda: random_id("resp"))
    media_io_kwargs: dict[str, dict[str, Any]] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    structured_outputs: StructuredOutputs | None = None
    repetition_penalty: float | None = None
    seed: int | None = Field(default=None, ge=-(2**31), lt=2**31)
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: StrictBool = False
    kv_transfer_params: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    # vLLM's fields this gateway does not do (besides the chat ones): harmony history, raw
    # prompt/output messages in the reply, and prompt templates (vLLM refuses those too).
    REFUSED: ClassVar[dict[str, tuple[Any, ...]]] = {
        **UNSUPPORTED,
        "previous_input_messages": NOT_ASKED,
        "enable_response_messages": NOT_ASKED,
        "prompt": (None,),
    }

    @model_validator(mode="before")
    @classmethod
    def _checks(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for name, not_asked in cls.REFUSED.items():
            if name in data and data[name] not in not_asked:
                if name == "prompt":
                    raise FieldError("prompt template is not supported", "prompt")
                raise FieldError(f"{name} is not supported by this gateway", name)
        if data.get("background") and not data.get("store", True):
            raise FieldError("background can only be used when `store` is true", "background")
        _check_tools(data)
        return data

    def include_logprobs(self) -> bool:
        return LOGPROBS in (self.include or [])

    def named_tool(self) -> str | None:
        choice = self.tool_choice
        return choice.get("name") if isinstance(choice, dict) else None


def _check_tools(data: dict[str, Any]) -> None:
    """vLLM's check_tool_usage, and only function tools (the rest are OpenAI's hosted tools,
    which a gateway in front of a model cannot run)."""
    tools = data.get("tools") or []
    if not isinstance(tools, list):
        return  # pydantic names it
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise FieldError(f"tools[{i}]: tool type {kind!r} is not supported", "tools")
        if not isinstance(tool.get("name"), str):
            raise FieldError(f"tools[{i}].name is required", "tools")
    choice = data.get("tool_choice", "auto")
    named = isinstance(choice, dict) and choice.get("type") in ("function", "custom")
    if isinstance(choice, dict) and not named:
        raise FieldError(f"tool_choice type {choice.get('type')!r} is not supported", "tool_choice")
    if not tools:
        if choice in ("auto", "none"):
            data["tool_choice"] = "none"
        elif choice == "required":
            raise FieldError(
                "Tool choice 'required' must be specified with 'tools' parameter.", "tool_choice"
            )
        elif named:
            raise FieldError(
                "Tool choice 'function' not found in 'tools' parameter.", "tool_choice"
            )
    elif named and choice.get("name") not in {tool["name"] for tool in tools}:
        raise FieldError("Tool choice 'function' not found in 'tools' parameter.", "tool_choice")
