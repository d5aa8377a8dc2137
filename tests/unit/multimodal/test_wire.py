"""Our wire encoding read back by the worker's decoder, its serialized pieces equal to the message
form; bfloat16 rounding as torch does it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine_server.tensors import tensor_from_proto
from multimodal.hashing import item_hash, settings_fingerprint
from multimodal.processors.base import ProcessedItems
from multimodal.wire import (
    encode_multimodal_inputs,
    field_pieces,
    multimodal_inputs,
    tensor_data,
    to_bfloat16_bits,
)
from protos import vllm_engine_pb2 as pb


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
    # NaNs whose payload would carry into the exponent (or past 2**32) when rounded
    nans = np.array([0x7FFFFFFF, 0xFFFFFFFF, 0x7F808000, 0xFFC00001], np.uint32).view(np.float32)
    assert np.isnan(nans).all()
    bits = to_bfloat16_bits(nans).view(np.int16)
    assert np.isnan(torch.from_numpy(bits).view(torch.bfloat16).float().numpy()).all()
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


def _processed(pixels: np.ndarray, **extra: np.ndarray) -> ProcessedItems:
    return ProcessedItems(
        tensors={"pixel_values": pixels, **extra},
        batched_keys=("image_sizes",) if "image_sizes" in extra else (),
        flat_keys={"pixel_values": "image_grid_thw"} if "image_grid_thw" in extra else {},
        keep_on_cpu_keys=("image_grid_thw",) if "image_grid_thw" in extra else (),
        embed_token_id=7 if "image_sizes" in extra else None,
    )


_RNG = np.random.default_rng(1)
_CASES = {
    "qwen uint8": _processed(
        _RNG.integers(0, 256, (2 * 6, 1176), dtype=np.uint8),
        image_grid_thw=np.array([[1, 2, 2], [1, 4, 2]], dtype=np.int64),
    ),
    "llava floats": _processed(
        _RNG.normal(size=(2, 3, 3, 14, 14)).astype(np.float32),
        image_sizes=np.array([[14, 14], [28, 7]], dtype=np.int64),
    ),
    "non-contiguous": _processed(_RNG.normal(size=(40, 30)).astype(np.float32).T),
    "empty": _processed(np.zeros((0, 1176), np.uint8), image_grid_thw=np.zeros((0, 3), np.int64)),
}


@pytest.mark.parametrize("case", sorted(_CASES))
@pytest.mark.parametrize("dtype", [None, "float32", "float16", "bfloat16"])
def test_encoded_pieces_parse_to_the_message(case, dtype):
    processed = _CASES[case]
    ranges, hashes = [(3, 4), (9, 8)], ["a" * 64, "b" * 64]
    message = multimodal_inputs(processed, ranges, hashes, dtype)
    pieces = encode_multimodal_inputs(processed, ranges, hashes, dtype)
    assert pb.MultimodalInputs.FromString(b"".join(pieces)) == message
    # and as a field of a GenerateRequest, after the request's own fields
    request = pb.GenerateRequest(request_id="r", tokenized=pb.TokenizedInput(input_ids=[1, 2]))
    number = pb.GenerateRequest.DESCRIPTOR.fields_by_name["mm_inputs"].number
    sent = b"".join([request.SerializeToString(), *field_pieces(number, pieces)])
    request.mm_inputs.CopyFrom(message)
    assert pb.GenerateRequest.FromString(sent) == request


def test_encoded_pixels_are_views_of_the_array_not_copies():
    pixels = np.arange(1176 * 4, dtype=np.uint8).reshape(4, 1176)
    pieces = encode_multimodal_inputs(_processed(pixels), [(0, 4)], ["h" * 64])
    views = [p for p in pieces if isinstance(p, memoryview) and p.nbytes == pixels.nbytes]
    assert len(views) == 1
    pixels[0, 0] = 255  # the view sees the array's memory
    assert views[0][0] == 255
