"""TensorData decoding for every wire dtype (no engine needed)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine_server.errors import InvalidRequest
from engine_server.tensors import WIRE_DTYPES, tensor_from_proto
from protos import common_pb2
from protos import vllm_engine_pb2 as pb


@pytest.mark.parametrize("name", sorted(WIRE_DTYPES))
def test_every_wire_dtype_round_trips(name):
    values = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4) * 0.5
    if not WIRE_DTYPES[name].is_floating_point:
        values = values.floor()
    source = values.to(WIRE_DTYPES[name])
    raw = source.contiguous().view(torch.uint8).numpy().tobytes()  # little-endian on x86/arm
    decoded = tensor_from_proto(pb.TensorData(inline=raw, shape=[2, 3, 4], dtype=name), "t")
    expected = source.to(torch.int64) if name == "uint32" else source
    assert decoded.dtype == expected.dtype and torch.equal(decoded, expected)


def test_numpy_bytes_decode_the_same():
    array = np.linspace(-1, 1, 12, dtype=np.float16).reshape(3, 4)
    td = pb.TensorData(inline=array.tobytes(), shape=[3, 4], dtype="float16")
    assert np.array_equal(tensor_from_proto(td, "t").numpy(), array)


@pytest.mark.parametrize(
    "td, mentions",
    [
        (pb.TensorData(inline=b"\0" * 8, shape=[2], dtype="complex64"), "unknown dtype"),
        (pb.TensorData(inline=b"\0" * 7, shape=[2], dtype="float32"), "7 bytes"),
        (
            pb.TensorData(
                shm=common_pb2.ShmHandle(name="../x", nbytes=4), shape=[1], dtype="float32"
            ),
            "invalid shared-memory name",
        ),
    ],
)
def test_malformed_tensors_name_the_field(td, mentions):
    with pytest.raises(InvalidRequest) as err:
        tensor_from_proto(td, "mm_inputs.pixel_values")
    assert "mm_inputs.pixel_values" in str(err.value) and mentions in str(err.value)
