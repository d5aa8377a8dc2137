"""OpenAI-style error bodies: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

from http import HTTPStatus

import grpc
from fastapi.responses import JSONResponse


class GatewayError(Exception):
    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param


def error_body(message: str, status: int, param: str | None = None) -> dict:
    kind = "BadRequestError" if status < 500 else "InternalServerError"
    if status == 404:
        kind = "NotFoundError"
    elif status == 401:
        kind = "AuthenticationError"
    elif status in (429, 503):
        kind = "ServiceUnavailableError"
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def error_response(error: GatewayError) -> JSONResponse:
    return JSONResponse(error_body(error.message, error.status, error.param), error.status)


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
