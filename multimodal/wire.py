"""numpy tensors to the wire's TensorData / MultimodalInputs (raw little-endian bytes)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np

from multimodal.processors.base import ProcessedImages
from protos import common_pb2
from protos import vllm_engine_pb2 as pb

FLOAT_DTYPES = ("float32", "float16", "bfloat16")
PRIMARY_KEY = "pixel_values"


def to_bfloat16_bits(array: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), rounding to nearest even as torch does."""
    bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)
    rounded = (bits + (np.uint32(0x7FFF) + ((bits >> 16) & 1))) >> 16
    # NaN must stay NaN: rounding could carry a NaN payload into infinity.
    rounded = np.where(np.isnan(array), (bits >> 16) | 0x40, rounded)
    return rounded.astype(np.uint16)


def tensor_data(array: np.ndarray, dtype: str | None = None) -> pb.TensorData:
    """`dtype` casts floating tensors (float32, float16 or bfloat16); others keep their own."""
    name = str(array.dtype)
    if dtype is not None and np.issubdtype(array.dtype, np.floating):
        name, array = dtype, _cast(array, dtype)
    if sys.byteorder != "little":
        array = array.byteswap()
    array = np.ascontiguousarray(array)
    return pb.TensorData(inline=array.tobytes(), shape=list(array.shape), dtype=name)


def _cast(array: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":  # numpy has no bfloat16: send its bit patterns
        return to_bfloat16_bits(array)
    return array.astype(dtype, copy=False)


def multimodal_inputs(
    processed: ProcessedImages,
    ranges: Sequence[tuple[int, int]],
    hashes: Sequence[str],
    float_dtype: str | None = None,
    modality: int = common_pb2.IMAGE,
) -> pb.MultimodalInputs:
    tensors = processed.tensors
    mm = pb.MultimodalInputs(
        pixel_values=tensor_data(tensors[PRIMARY_KEY], float_dtype),
        model_specific_tensors={
            k: tensor_data(v, float_dtype) for k, v in tensors.items() if k != PRIMARY_KEY
        },
        mm_placeholders=[pb.PlaceholderRange(offset=o, length=n) for o, n in ranges],
        mm_hashes=list(hashes),
        batched_keys=list(processed.batched_keys),
        flat_keys=dict(processed.flat_keys),
        keep_on_cpu_keys=list(processed.keep_on_cpu_keys),
        modality=modality,
    )
    if processed.embed_token_id is not None:
        mm.im_token_id = processed.embed_token_id
    return mm
