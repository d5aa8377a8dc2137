"""OpenAI request bodies the gateway accepts, with vLLM's extensions under vLLM's names.

Fields the wire cannot carry to an engine (beam search, bad_words, allowed_token_ids, ...) are
refused with a 400 rather than silently ignored; unknown fields are ignored, as OpenAI and vLLM
do, so SDK upgrades keep working. Booleans are strict, as OpenAI's API has them: `"stream":
"yes"` is a 400, where pydantic's lax mode (and so vLLM) reads it as true.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, model_validator

from gateway.errors import FieldError

# Integer fields are bounded by what the wire carries (uint32 / int32), so none fails there.
TokenId = Annotated[int, Field(ge=0, lt=2**32)]
NOT_ASKED = (None, False, [], {})
# vLLM's request fields that this gateway does not do, each with the values that mean "not
# asked for" (what an SDK that sends every default sends): any other value is a 400 naming the
# field, never silently ignored. Some the wire cannot carry (beam search, bad_words, ...); the
# others change what comes back in ways not built here (extra response fields, another
# truncation side, plugin args, scheduling, ...).
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    **dict.fromkeys(
        (
            "use_beam_search",
            "bad_words",
            "allowed_token_ids",
            "logprob_token_ids",
            "prompt_embeds",
            "repetition_detection",
            "cache_salt",
            "documents",
            "ec_transfer_params",
            "return_mm_kwargs",
            "return_prompt_text",
            "return_token_ids",
            "return_token_offsets",
            "return_tokens_as_token_ids",
            "session_id",
            "stream_interval",
            "vllm_xargs",
            "watermarking",
        ),
        NOT_ASKED,
    ),
    "length_penalty": (None, 1, 1.0),
    "mm_payload": (None, "tensors"),
    "priority": (None, 0),
    "routed_experts_prompt_start": (None, 0),
    "truncation_side": (None, "left"),  # truncate_prompt_tokens keeps the last tokens
}

_BUDGET_MESSAGE = "`thinking_token_budget` must be a non-negative integer or -1 for unlimited."


def _thinking_token_budget(value: Any) -> int | None:
    """vLLM's validate_thinking_token_budget: an integer (not a bool or a float), -1 is
    unlimited (unset), below that a 400 with its message."""
    if value is None:
        return None
    if isinstance(value, (bool, float)) or not isinstance(value, int) or value < -1:
        raise FieldError(_BUDGET_MESSAGE, "thinking_token_budget", value)
    return None if value == -1 else value


ThinkingTokenBudget = Annotated[int | None, BeforeValidator(_thinking_token_budget)]


class JsonSchema(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="allow")
    name: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchema | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and (
            self.json_schema is None or self.json_schema.json_schema is None
        ):
            raise ValueError("response_format json_schema needs json_schema.schema")
        return self


class StructuredOutputs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    structural_tag: str | None = None
    json_object: StrictBool | None = None

    @model_validator(mode="after")
    def _one_constraint(self) -> StructuredOutputs:
        chosen = [k for k, v in self.__dict__.items() if v is not None and v is not False]
        if len(chosen) > 1:
            raise ValueError(f"structured_outputs takes one constraint, got {chosen}")
        return self


class StreamOptions(BaseModel):
    include_usage: StrictBool | None = True
    continuous_usage_stats: StrictBool | None = False


class SamplingFields(BaseModel):
    """What chat and completion requests share."""

    # A number too large for a float (1e400) reads as infinity: no sampling field takes it.
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    model: str | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = Field(default=None, lt=2**32)
    min_p: float | None = None
    logit_bias: dict[str, float] | None = None
    seed: int | None = Field(default=None, ge=-(2**31), lt=2**31)
    n: int = Field(default=1, ge=1, le=128)
    max_tokens: int | None = Field(default=None, ge=1, lt=2**32)
    min_tokens: int = Field(default=0, ge=0, lt=2**32)
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: StrictBool = False
    skip_special_tokens: StrictBool = True
    spaces_between_special_tokens: StrictBool = True
    include_stop_str_in_output: StrictBool = False
    prompt_logprobs: int | None = Field(default=None, ge=-1, lt=2**31)
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1, lt=2**31)
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    kv_transfer_params: dict[str, Any] | None = None
    request_id: str | None = None
    # Enforced by the engine (its reasoning config); only a worker that advertises it gets
    # one (gateway.workers.pool), in the call's metadata (protos/extensions.py).
    thinking_token_budget: ThinkingTokenBudget = None

    REFUSED: ClassVar[dict[str, tuple[Any, ...]]] = UNSUPPORTED

    @model_validator(mode="before")
    @classmethod
    def _refuse_what_is_not_done(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, not_asked in cls.REFUSED.items():
                if name in data and data[name] not in not_asked:
                    raise FieldError(f"{name} is not supported by this gateway", name)
        return data

    @model_validator(mode="after")
    def _no_prompt_logprobs_when_streaming(self) -> SamplingFields:
        if self.stream and self.prompt_logprobs is not None:
            raise ValueError("`prompt_logprobs` are not available when `stream=True`.")
        return self

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class ChatPromptFields(BaseModel):
    """What turns messages into a prompt: chat completions and /tokenize share it."""

    model_config = ConfigDict(extra="allow")
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    add_special_tokens: StrictBool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    # vLLM's per-request media loader options, by modality: {"video": {"fps": 1,
    # "num_frames": 16}} (what the gateway's video families take; anything else is a 400).
    media_io_kwargs: dict[str, dict[str, Any]] | None = None


_NAMED_USAGE = 'Correct usage: `{"type": "function", "function": {"name": "my_function"}}`'


def _check_tool_choice(data: dict[str, Any]) -> None:
    """vLLM's check_tool_usage: the same defaults and the same messages."""
    if data.get("tools") == []:
        raise FieldError(
            "`tools` must not be an empty array. Either provide at least one tool or omit the "
            "field entirely.",
            "tools",
        )
    if "tool_choice" not in data:
        data["tool_choice"] = "auto" if data.get("tools") else "none"
    choice = data["tool_choice"]
    if choice is None or choice == "none":
        return
    if data.get("tools") is None:
        raise FieldError("When using `tool_choice`, `tools` must be set.", "tool_choice")
    if choice in ("auto", "required"):
        return
    if not isinstance(choice, dict):
        raise FieldError(
            f'Invalid value for `tool_choice`: {choice}! Only named tools, "none", "auto" or '
            '"required" are supported.',
            "tool_choice",
        )
    _check_named_choice(data, choice)


def _check_named_choice(data: dict[str, Any], choice: dict[str, Any]) -> None:
    function = choice.get("function")
    if not isinstance(function, dict):
        raise FieldError(
            f"Invalid value for `function`: `{function}` in `tool_choice`! {_NAMED_USAGE}",
            "tool_choice.function",
        )
    if "name" not in function:
        raise FieldError(
            f"Expected field `name` in `function` in `tool_choice`! {_NAMED_USAGE}",
            "tool_choice.function.name",
        )
    name = function["name"]
    if not isinstance(name, str) or not name:
        raise FieldError(
            f"Invalid `name` in `function`: `{name}` in `tool_choice`! {_NAMED_USAGE}",
            "tool_choice.function.name",
        )
    names = [(t.get("function") or {}).get("name") for t in data["tools"] if isinstance(t, dict)]
    if name not in names:
        raise FieldError(
            "The tool specified in `tool_choice` does not match any of the specified `tools`",
            "tool_choice",
        )
    so = data.get("structured_outputs")
    if isinstance(so, dict) and any(so.get(k) is not None for k in ("json", "regex", "choice")):
        raise FieldError(
            "You can only either use constraints for structured outputs or tools, not both."
        )


class ChatCompletionRequest(ChatPromptFields, SamplingFields):
    logprobs: StrictBool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    max_completion_tokens: int | None = Field(default=None, ge=1, lt=2**32)
    # vLLM's default: "auto" when tools are given, else "none" (set by the validator).
    tool_choice: str | dict[str, Any] | None = "none"
    parallel_tool_calls: StrictBool | None = True
    include_reasoning: StrictBool = True
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = (
        None
    )
    # vLLM's chat `echo` (the last message's content before the reply) is not done here.
    REFUSED: ClassVar[dict[str, tuple[Any, ...]]] = {**UNSUPPORTED, "echo": NOT_ASKED}

    @model_validator(mode="before")
    @classmethod
    def _tool_usage(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            _check_tool_choice(data)
        return data

    def output_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def apply_reasoning_effort(self) -> None:
        """vLLM's build_chat_params: the template (and the parsers) see ``reasoning_effort``,
        and ``enable_thinking`` follows it unless the request set that itself."""
        if self.reasoning_effort is None:
            return
        kwargs = dict(self.chat_template_kwargs or {})
        if "enable_thinking" not in kwargs:
            kwargs["enable_thinking"] = self.reasoning_effort != "none"
        kwargs["reasoning_effort"] = self.reasoning_effort
        self.chat_template_kwargs = kwargs

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def output_constraint(self) -> dict[str, Any] | None:
        """The request's own constraint with vLLM's field names (response_format folded in)."""
        fmt = self.response_format
        if fmt is not None and fmt.type == "json_object":
            return {"json_object": True}
        if fmt is not None and fmt.type == "json_schema" and fmt.json_schema is not None:
            return {"json": fmt.json_schema.json_schema}
        so = self.structured_outputs
        if so is None:
            return None
        return {
            ("json" if k == "json_" else k): v
            for k, v in so.model_dump(exclude_none=True).items()
            if v is not False
        }

    def replace_output_constraint(self, structured_outputs: dict[str, Any]) -> None:
        """Hold the output to ``structured_outputs`` (vLLM's names; the parsers' tool-call
        grammar) instead of the request's own constraint."""
        self.structured_outputs = StructuredOutputs.model_validate(structured_outputs)
        self.response_format = None


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: StrictBool = False
    suffix: str | None = None
    # A completion's prompt always gets the tokenizer's special tokens (vLLM's default).
    REFUSED: ClassVar[dict[str, tuple[Any, ...]]] = {
        **UNSUPPORTED,
        "add_special_tokens": (None, True),
    }

    def output_logprobs(self) -> int | None:
        return self.logprobs

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens if "max_tokens" in self.model_fields_set else 16


class TokenizeCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    prompt: str
    add_special_tokens: StrictBool = True
    return_token_strs: StrictBool | None = False


class TokenizeChatRequest(ChatPromptFields):
    model: str | None = None
    return_token_strs: StrictBool | None = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    tokens: list[int]


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    input: str | list[str] | list[int] | list[list[int]]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None


class PreprocessRequest(ChatPromptFields):
    """The prompt fields of a chat completion request; sampling fields are ignored."""

    model: str | None = None


class TensorFacts(BaseModel):
    shape: list[int]
    dtype: str  # as it travels to the worker


class PlaceholderFacts(BaseModel):
    offset: int  # in the expanded prompt's token ids
    length: int


class ItemFacts(BaseModel):
    """What every media item's facts hold, whatever its modality."""

    index: int  # the item's position among its modality's in the request ("image 1: ...")
    bytes: int  # encoded size
    mime: str | None  # sniffed from the bytes
    # The rest is known when the gateway preprocesses (null when a worker does):
    placeholder: PlaceholderFacts | None = None
    tokens: int | None = None  # prompt tokens the item takes
    embeddings: int | None = None  # of those, the ones the encoder fills
    # The item's small integer layout tensors: grid (Qwen-VL's image_grid_thw [t, h, w] in
    # patches), tile counts (num_patches, image_num_patches, patches_per_image), ...
    grid: dict[str, Any] = {}
    tensors: dict[str, TensorFacts] = {}
    hash: str | None = None  # the engine's cache key for the item


class ImageFacts(ItemFacts):
    width: int | None = None  # decoded, EXIF orientation applied (null when a worker decodes)
    height: int | None = None


class VideoFacts(ImageFacts):
    """A video's facts: the image's (width and height of its frames as decoded), and which of
    its frames were decoded, as the model's video loader in vLLM picks them."""

    total_frames: int | None = None  # the clip's, after the decoder's count correction
    fps: float | None = None  # the container's rate (1 for a frame list, as vLLM)
    frames: list[int] | None = None  # the source frames decoded, in order
    seconds: list[float] | None = None  # their times in the clip (frame / fps)


class AudioFacts(ItemFacts):
    """An audio clip's facts, known whoever preprocesses it: the gateway checks and decodes
    every clip (at its own rate, as vLLM's loader decodes it) before a worker gets it."""

    format: str | None = None  # the container sniffed from the bytes: wav, flac, mpeg, ogg
    sample_rate: int | None = None  # as decoded, before any resampling for the model
    channels: int | None = None
    seconds: float | None = None  # decoded samples / sample rate


class PreprocessResponse(BaseModel):
    object: Literal["preprocess"] = "preprocess"
    model: str
    # Who preprocesses the request's media: this gateway, or the workers (a model without a
    # processor here, or --mm-processing worker); null without media.
    processed_by: Literal["gateway", "worker"] | None
    family: str | None  # the gateway's processor for the model's images, e.g. "qwen_vl"
    family_title: str | None  # e.g. "Qwen-VL"
    pixels: str | None  # the dtype pixels travel in ("uint8" for engines normalizing on device)
    # The prompt's length with every image expanded (when a worker preprocesses: one
    # placeholder per image, which the worker expands).
    prompt_tokens: int
    images: list[ImageFacts]
    videos: list[VideoFacts] = []
    video_family: str | None = None  # the gateway's processor for the model's videos
    audio: list[AudioFacts] = []
    audio_family: str | None = None  # the gateway's processor for the model's audio
    # The media the model takes through this gateway ("image", "video", "audio"), processed
    # here or by the workers: what a client (the playground) may offer to attach.
    modalities: list[str] = []
