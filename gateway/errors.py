"""Every error the gateway answers with, and the one mapping from errors to HTTP responses.

All of them descend from `MmgateError` (multimodal.errors), which carries the HTTP status and
the request field at fault; whatever raises one is answered with it as it is, by
`error_response` (routes) or as the error event of a stream (`stream.sse`). The only
translations are at the edges: a worker's gRPC status (`from_grpc`) and pydantic's validation
errors (`parse_body`).

The body is OpenAI's: {"error": {"message", "type", "param", "code"}}.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any, TypeVar

import grpc
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from multimodal.errors import MmgateError

__all__ = [
    "BundleError",
    "ChatRequestError",
    "GatewayError",
    "MmgateError",
    "SamplingError",
    "error_body",
    "error_response",
    "from_grpc",
]

ModelT = TypeVar("ModelT", bound=BaseModel)


class GatewayError(MmgateError):
    """A refusal by the serving layer itself, with its own status (404, 429, 502, 503...);
    `error_type`: the body's error type where vLLM writes another than the status's own."""

    def __init__(
        self,
        message: str,
        status: int | None = None,
        param: str | None = None,
        error_type: str | None = None,
    ) -> None:
        super().__init__(message, status, param)
        self.error_type = error_type


class ChatRequestError(MmgateError):
    """The messages cannot be rendered with the model's chat template."""

    param = "messages"


class SamplingError(MmgateError):
    """A request the model's context or the wire cannot take; `param` names the field."""


class BundleError(MmgateError):
    """A worker's tokenizer bundle is damaged or unsafe to unpack."""

    status = 502


def error_body(
    message: str, status: int, param: str | None = None, error_type: str | None = None
) -> dict:
    return {
        "error": {
            "message": message,
            "type": error_type or _kind(status),
            "param": param,
            "code": status,
        }
    }


def _kind(status: int) -> str:
    if status == 404:
        return "NotFoundError"
    if status == 401:
        return "AuthenticationError"
    if status in (429, 503):
        return "ServiceUnavailableError"
    return "BadRequestError" if status < 500 else "InternalServerError"


def error_response(error: MmgateError) -> JSONResponse:
    body = error_body(error.message, error.status, error.param, getattr(error, "error_type", None))
    return JSONResponse(body, error.status)


_GRPC_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: HTTPStatus.BAD_REQUEST,
    grpc.StatusCode.RESOURCE_EXHAUSTED: HTTPStatus.TOO_MANY_REQUESTS,
    grpc.StatusCode.UNAVAILABLE: HTTPStatus.SERVICE_UNAVAILABLE,
    grpc.StatusCode.UNIMPLEMENTED: HTTPStatus.NOT_IMPLEMENTED,
    grpc.StatusCode.DEADLINE_EXCEEDED: HTTPStatus.GATEWAY_TIMEOUT,
}


def from_grpc(error: grpc.aio.AioRpcError) -> GatewayError:
    status = _GRPC_STATUS.get(error.code(), HTTPStatus.INTERNAL_SERVER_ERROR)
    prefix = "" if status == HTTPStatus.BAD_REQUEST else "engine worker: "
    return GatewayError(f"{prefix}{error.details() or error.code().name}", int(status))


class FieldError(ValueError):
    """A request field refused by a validator, worded as vLLM words it: the message then
    ``(parameter=NAME)``, or ``(parameter=NAME, value=VALUE)`` when given one, as its
    VLLMValidationError prints."""

    def __init__(self, message: str, param: str | None = None, value: Any = None) -> None:
        extras = [f"{k}={v}" for k, v in (("parameter", param), ("value", value)) if v is not None]
        super().__init__(f"{message} ({', '.join(extras)})" if extras else message)
        self.param = param


def parse_body(model: type[ModelT], body: object) -> ModelT:
    """Validate a request body; the first problem becomes a 400 naming its field."""
    try:
        return model.model_validate(body)
    except ValidationError as error:
        first = error.errors()[0]
        cause = (first.get("ctx") or {}).get("error")
        if isinstance(cause, FieldError):
            raise GatewayError(str(cause), 400, cause.param) from None
        param = ".".join(str(p) for p in first.get("loc", ())) or None
        raise GatewayError(first["msg"], 400, param) from None


def check_model(requested: str | None, served: str) -> None:
    if requested not in (None, served):
        raise GatewayError(f"The model `{requested}` does not exist.", 404, "model")
