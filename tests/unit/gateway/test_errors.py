"""One error root, one mapping to HTTP: what each kind of failure answers, unconverted."""

from __future__ import annotations

import json

import grpc
import pytest

from gateway.errors import (
    BundleError,
    ChatRequestError,
    GatewayError,
    MmgateError,
    SamplingError,
    error_response,
    from_grpc,
)
from multimodal.errors import MediaDecodeError
from multimodal.processors.base import ModelConfigError, OptionError, UnsupportedModel
from multimodal.prompt import PromptError


@pytest.mark.parametrize(
    ("error", "status", "param", "message", "kind"),
    [
        (ChatRequestError("bad role"), 400, "messages", "bad role", "BadRequestError"),
        (SamplingError("no", param="top_k"), 400, "top_k", "no", "BadRequestError"),
        (OptionError("bad key"), 400, "mm_processor_kwargs", "bad key", "BadRequestError"),
        (PromptError("count"), 400, "mm_processor_kwargs", "count", "BadRequestError"),
        (MediaDecodeError("not an image", index=1), 400, "messages",
         "invalid image: image 1: not an image", "BadRequestError"),
        (UnsupportedModel("no images"), 400, None, "no images", "BadRequestError"),
        (GatewayError("gone", 404, "model"), 404, "model", "gone", "NotFoundError"),
        (GatewayError("busy", 429), 429, None, "busy", "ServiceUnavailableError"),
        (BundleError("bad zip"), 502, None, "bad zip", "InternalServerError"),
        (ModelConfigError("odd config"), 500, None, "odd config", "InternalServerError"),
    ],
)  # fmt: skip
def test_every_kind_answers_with_its_own_status(error, status, param, message, kind):
    assert isinstance(error, MmgateError)
    response = error_response(error)
    assert response.status_code == status
    assert json.loads(response.body) == {
        "error": {"message": message, "type": kind, "param": param, "code": status}
    }


def test_worker_statuses_map_at_the_edge():
    def rpc(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
        return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)

    bad = from_grpc(rpc(grpc.StatusCode.INVALID_ARGUMENT, "token id 9 is out of vocabulary"))
    assert (bad.status, bad.message) == (400, "token id 9 is out of vocabulary")
    down = from_grpc(rpc(grpc.StatusCode.UNAVAILABLE, "draining"))
    assert (down.status, down.message) == (503, "engine worker: draining")
