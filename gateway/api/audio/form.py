"""The multipart form of /v1/audio/transcriptions and /translations, read as vLLM 0.32 reads it
(vllm/entrypoints/speech_to_text/*/protocol.py: form fields validated by pydantic in lax mode,
so "true" and "0.5" are a bool and a float), and the uploaded file under vLLM's size limit.

The limits are the gateway's audio limits (`--max-audio-bytes`, `--max-audio-seconds`,
`--max-audio-decoded-mib`), the same as for chat clips; their defaults are vLLM's environment
variables when set (VLLM_MAX_AUDIO_CLIP_FILESIZE_MB, VLLM_MAX_AUDIO_DECODE_DURATION_S,
VLLM_MAX_AUDIO_DECODE_BYTES), so one setting bounds both servers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.datastructures import UploadFile
from starlette.requests import Request

from gateway.errors import FieldError, GatewayError, parse_body
from multimodal.policy import MediaPolicy

MIB = 1024 * 1024
# Besides the file, the form's text fields (a prompt is at most a few KB).
_FORM_SLACK_BYTES = MIB
_READ_BYTES = 64 * 1024


@dataclass(frozen=True)
class AudioLimits:
    max_file_bytes: int = 25 * MIB
    max_duration_s: float = 600
    max_decode_bytes: int = 268_435_456

    @classmethod
    def from_env(cls, env: Any = os.environ) -> AudioLimits:
        """vLLM's defaults, or its environment variables where set."""
        return cls(
            max_file_bytes=int(float(env.get("VLLM_MAX_AUDIO_CLIP_FILESIZE_MB", "25")) * MIB),
            max_duration_s=float(env.get("VLLM_MAX_AUDIO_DECODE_DURATION_S", "600")),
            max_decode_bytes=int(env.get("VLLM_MAX_AUDIO_DECODE_BYTES", "268435456")),
        )

    @classmethod
    def from_policy(cls, policy: MediaPolicy) -> AudioLimits:
        return cls(
            max_file_bytes=policy.max_audio_bytes,
            max_duration_s=policy.max_audio_seconds,
            max_decode_bytes=policy.max_audio_decoded_bytes,
        )


class SpeechRequest(BaseModel):
    """The fields both routes take (translation's set); transcription adds a few."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    model: str | None = None
    language: str | None = None
    hotwords: str | None = None
    prompt: str = ""
    response_format: Literal["json", "text", "srt", "verbose_json", "vtt"] = "json"
    stream: bool | None = False
    stream_include_usage: bool | None = False
    stream_continuous_usage_stats: bool | None = False
    to_language: str | None = None
    use_beam_search: bool = False
    n: int = 1
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False
    temperature: float = 0.0
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)
    frequency_penalty: float | None = 0.0
    repetition_penalty: float | None = None
    presence_penalty: float | None = 0.0
    max_completion_tokens: int | None = None
    vllm_xargs: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _stream_options(cls, data: Any) -> Any:
        if isinstance(data, dict) and not _truthy(data.get("stream")):
            for option in ("stream_include_usage", "stream_continuous_usage_stats"):
                if _truthy(data.get(option)):
                    raise FieldError(
                        "Stream options can only be defined when `stream=True`.", option
                    )
        return data


class TranscriptionRequest(SpeechRequest):
    response_format: Literal[  # type: ignore[assignment]
        "json", "text", "srt", "verbose_json", "vtt", "diarized_json"
    ] = "json"
    timestamp_granularities: list[Literal["word", "segment"]] = Field(
        default_factory=list, alias="timestamp_granularities[]"
    )


def _truthy(value: Any) -> bool:
    return str(value).strip().lower() in {"1", "true", "t", "yes", "y", "on"}


async def read_form(
    request: Request, model: type[SpeechRequest], limits: AudioLimits
) -> tuple[SpeechRequest, bytes]:
    """The form's fields and the uploaded file's bytes; a 400 for a form vLLM refuses, or a
    file past the size limit (before the rest of an oversized body is read, when its length
    is declared)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limits.max_file_bytes + _FORM_SLACK_BYTES:
        raise _too_large()
    try:
        form = await request.form(max_files=1, max_fields=64)
    except Exception as error:  # starlette's MultiPartException and malformed bodies
        raise GatewayError(
            f"the request body is not a valid multipart form: {error}", 400
        ) from None
    fields: dict[str, Any] = {}
    upload = None
    for key, value in form.multi_items():
        if isinstance(value, UploadFile):
            if key == "file":
                upload = value
            continue
        if key == "timestamp_granularities[]":
            fields.setdefault(key, []).append(value)
        else:
            fields[key] = value
    if "file" in fields:  # a text field named file
        raise GatewayError("Expected 'file' to be a file-like object, not 'str'.", 422, "file")
    parsed = parse_body(model, fields)
    if upload is None:
        raise GatewayError("Field required", 400, "body.file")
    return parsed, await _read_upload(upload, limits.max_file_bytes)


async def _read_upload(upload: UploadFile, max_bytes: int) -> bytes:
    if upload.size is not None and upload.size > max_bytes:
        raise _too_large()
    chunks, total = [], 0
    while chunk := await upload.read(_READ_BYTES):
        total += len(chunk)
        if total > max_bytes:
            raise _too_large()
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large() -> GatewayError:
    return GatewayError("Maximum file size exceeded", 400, "audio_filesize_mb")
