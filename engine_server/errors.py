"""Which gRPC status a failure becomes: the caller's fault is INVALID_ARGUMENT, ours INTERNAL."""

from __future__ import annotations

from http import HTTPStatus

import grpc
from vllm.exceptions import GracefulHTTPError, VLLMClientError

from protos.extensions import CacheMiss, cache_miss_message


class InvalidRequest(ValueError):
    """A request the engine must refuse; the message names the offending field."""


class MediaUnavailable(RuntimeError):
    """Media a request refers to could not be fetched now (a timeout, a refused connection):
    UNAVAILABLE, so a router may retry the request elsewhere."""


class CacheMissError(RuntimeError):
    """Items a request left out of its tensors that the worker's item cache does not hold
    (engine_server/mm_item_cache.py): FAILED_PRECONDITION, whose message names them all
    (protos.extensions.cache_miss_message) so that the sender resends them."""

    def __init__(self, miss: CacheMiss) -> None:
        super().__init__(cache_miss_message(miss))
        self.miss = miss


# vLLM's admission control (queue full, too many queued tokens) says which HTTP status it
# means; these are the gRPC codes a router retries elsewhere or backs off on.
_HTTP_TO_GRPC = {
    HTTPStatus.SERVICE_UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    HTTPStatus.TOO_MANY_REQUESTS: grpc.StatusCode.RESOURCE_EXHAUSTED,
    HTTPStatus.BAD_REQUEST: grpc.StatusCode.INVALID_ARGUMENT,
}


def status_for(error: BaseException) -> grpc.StatusCode:
    # vLLM raises ValueError or VLLMClientError for bad input: out-of-vocabulary ids,
    # prompts longer than the context, sampling values it refuses.
    if isinstance(error, CacheMissError):
        return grpc.StatusCode.FAILED_PRECONDITION
    if isinstance(error, MediaUnavailable):
        return grpc.StatusCode.UNAVAILABLE
    if isinstance(error, (ValueError, TypeError, OverflowError, VLLMClientError)):
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(error, GracefulHTTPError):
        return _HTTP_TO_GRPC.get(error.http_status, grpc.StatusCode.UNAVAILABLE)
    if isinstance(error, NotImplementedError):
        return grpc.StatusCode.UNIMPLEMENTED
    cause = error.__cause__
    if cause is not None and cause is not error:
        return status_for(cause)
    return grpc.StatusCode.INTERNAL
