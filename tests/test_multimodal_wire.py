"""Our wire encoding read back by the worker's decoder; bfloat16 rounding as torch does it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine_server.tensors import tensor_from_proto
from multimodal.hashing import item_hash, settings_fingerprint
from multimodal.wire import tensor_data, to_bfloat16_bits


def test_bfloat16_bits_equal_torch_rounding():
    rng = np.random.default_rng(0)
    values = np.concatenate(
        [
            rng.normal(0, 3, 10000).astype(np.float32),
            np.array([0.0, -0.0, 1.0, np.inf, -np.inf, 1e-40, 3.3895314e38], dtype=np.float32),
        ]
    )
    want = torch.from_numpy(values).to(torch.bfloat16).view(torch.uint16).numpy()
    assert np.array_equal(to_bfloat16_bits(values), want)
    assert np.isnan(
        torch.from_numpy(to_bfloat16_bits(np.array([np.nan], np.float32)).view(np.int16))
        .view(torch.bfloat16)
        .float()
        .numpy()
    ).all()


@pytest.mark.parametrize("dtype", [None, "float32", "float16", "bfloat16"])
def test_worker_decodes_what_we_encode(dtype):
    array = np.linspace(-2, 2, 2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    decoded = tensor_from_proto(tensor_data(array, dtype), "pixel_values")
    expected = torch.from_numpy(array).to(getattr(torch, dtype or "float32"))
    assert decoded.dtype == expected.dtype and torch.equal(decoded, expected)


def test_integer_and_uint8_tensors_keep_their_dtype():
    for array in (np.arange(6, dtype=np.int64).reshape(2, 3), np.arange(6, dtype=np.uint8)):
        td = tensor_data(array, "bfloat16")
        assert td.dtype == str(array.dtype)
        assert np.array_equal(tensor_from_proto(td, "t").numpy(), array)


def test_hash_covers_bytes_and_every_tensor_setting():
    base = settings_fingerprint("qwen_vl", {"max_pixels": 100}, "uint8")
    h = item_hash(b"image", base)
    assert h == item_hash(b"image", settings_fingerprint("qwen_vl", {"max_pixels": 100}, "uint8"))
    assert h != item_hash(b"imagf", base)
    assert h != item_hash(b"image", settings_fingerprint("qwen_vl", {"max_pixels": 101}, "uint8"))
    assert h != item_hash(b"image", settings_fingerprint("qwen_vl", {"max_pixels": 100}, "float32"))
    assert len(h) == 64
