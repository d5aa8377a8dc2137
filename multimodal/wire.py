"""numpy tensors to the wire's TensorData / MultimodalInputs (raw little-endian bytes).

Two forms: `multimodal_inputs` builds the protobuf message (for tools and tests), and
`encode_multimodal_inputs` gives the same message already serialized, as a list of pieces in
which each tensor's bytes are a view of the numpy array rather than a copy. The gateway sends
those pieces to the socket as they are: building the message copies every pixel twice, and
putting it into a GenerateRequest (`CopyFrom`, `SerializeToString`, the gRPC frame) three
more times, on the event loop. For a 1280x960 Qwen2.5-VL image (7.4 MB of uint8 patches)
that was 2.4 ms of stalled event loop per image, for a 3840x2160 one over 100 ms
(`benchmarks/wire_bench.py`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from multimodal.processors.base import Modality, ProcessedItems
from protos import common_pb2
from protos import vllm_engine_pb2 as pb

FLOAT_DTYPES = ("float32", "float16", "bfloat16")
PRIMARY_KEY = "pixel_values"
MODALITIES = {"image": common_pb2.IMAGE, "video": common_pb2.VIDEO, "audio": common_pb2.AUDIO}


def to_bfloat16_bits(array: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), rounding to nearest even as torch does.

    In place on one temporary: 3.7x faster than the expression form (2.5 vs 9.2 ms for a
    640x480 image's 1.8M values)."""
    values = np.ascontiguousarray(array, dtype=np.float32)
    bits = values.view(np.uint32)
    rounded = bits >> 16
    rounded &= 1  # the bit that decides ties: to even
    rounded += 0x7FFF
    rounded += bits  # cannot wrap below NaN's bit patterns (-inf + 0x8000 < 2**32)
    rounded >>= 16
    out = rounded.astype(np.uint16)
    # NaN must stay NaN: rounding could carry a NaN payload into infinity (or wrap it).
    nan = np.isnan(values)
    if nan.any():
        out[nan] = ((bits[nan] >> 16) | 0x40).astype(np.uint16)
    return out


# A piece of a serialized message: bytes, or a view of an array's memory.
Piece = bytes | memoryview


def tensor_data(array: np.ndarray, dtype: str | None = None) -> pb.TensorData:
    """`dtype` casts floating tensors (float32, float16 or bfloat16); others keep their own."""
    name, array = _wire_array(array, dtype)
    return pb.TensorData(inline=array.tobytes(), shape=list(array.shape), dtype=name)


def _wire_array(array: np.ndarray, dtype: str | None) -> tuple[str, np.ndarray]:
    """The dtype name the wire states, and the array as its C-contiguous little-endian bytes."""
    name = str(array.dtype)
    if dtype is not None and np.issubdtype(array.dtype, np.floating):
        name, array = dtype, _cast(array, dtype)
    if sys.byteorder != "little":
        array = array.byteswap()
    return name, np.ascontiguousarray(array)


def _cast(array: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":  # numpy has no bfloat16: send its bit patterns
        return to_bfloat16_bits(array)
    return array.astype(dtype, copy=False)


def multimodal_inputs(
    processed: ProcessedItems,
    ranges: Sequence[tuple[int, int]],
    hashes: Sequence[str],
    float_dtype: str | None = None,
    modality: Modality = "image",
) -> pb.MultimodalInputs:
    tensors, primary = processed.tensors, processed.encoder_key
    return _message(
        processed,
        ranges,
        hashes,
        modality,
        pixel_values=tensor_data(tensors[primary], float_dtype),
        model_specific_tensors={
            k: tensor_data(v, float_dtype) for k, v in tensors.items() if k != primary
        },
    )


def encode_multimodal_inputs(
    processed: ProcessedItems,
    ranges: Sequence[tuple[int, int]],
    hashes: Sequence[str],
    float_dtype: str | None = None,
    modality: Modality = "image",
) -> list[Piece]:
    """`multimodal_inputs(...)` serialized, as pieces to send one after another; the tensors'
    bytes are views of their arrays (kept alive by the views). Fields are in another order
    than `SerializeToString` writes them, which protobuf parsers accept by definition."""
    return flatten(multimodal_nodes(processed, ranges, hashes, float_dtype, modality))


def multimodal_nodes(
    processed: ProcessedItems,
    ranges: Sequence[tuple[int, int]],
    hashes: Sequence[str],
    float_dtype: str | None = None,
    modality: Modality = "image",
) -> list[Node]:
    """`encode_multimodal_inputs` before `flatten`: each tensor's bytes a `Payload` whose
    transport (inline or a /dev/shm segment) is chosen when it is flattened."""
    nodes: list[Node] = [_message(processed, ranges, hashes, modality).SerializeToString()]
    for key, value in processed.tensors.items():
        tensor = _tensor_nodes(value, float_dtype)
        if key == processed.encoder_key:
            nodes.append(Field(_PIXEL_VALUES, tensor))
        else:  # a map entry: key = 1, value = 2
            entry = [Field(_MAP_KEY, [key.encode()]), Field(_MAP_VALUE, tensor)]
            nodes.append(Field(_MODEL_SPECIFIC_TENSORS, entry))
    return nodes


@dataclass(frozen=True)
class Field:
    """A length-delimited field whose content is more nodes: its length is known only once
    they are flattened (a tensor's ShmHandle is shorter than its bytes)."""

    number: int
    nodes: Sequence[Node]


@dataclass(frozen=True)
class Payload:
    """A tensor's raw bytes: TensorData's `inline` field, or its `shm` handle."""

    data: bytes | memoryview


Node = bytes | memoryview | Field | Payload
# Where a payload goes: a handle to a segment holding its bytes, or None to send it inline.
Place = Callable[[bytes | memoryview], common_pb2.ShmHandle | None]


def flatten(nodes: Sequence[Node], place: Place | None = None) -> list[Piece]:
    """The nodes as pieces to send one after another; `place` decides each payload's
    transport (None: every payload inline). Never copies a payload."""
    pieces: list[Piece] = []
    for node in nodes:
        if isinstance(node, Field):
            pieces += field_pieces(node.number, flatten(node.nodes, place))
        elif isinstance(node, Payload):
            handle = place(node.data) if place is not None else None
            if handle is None:  # inline is in a oneof: on the wire even when empty
                pieces += field_pieces(_INLINE, [node.data])
            else:
                pieces += field_pieces(_SHM, [handle.SerializeToString()])
        else:
            pieces.append(node)
    return pieces


def payload_sizes(nodes: Sequence[Node]) -> list[int]:
    """The byte counts of the nodes' payloads, in order."""
    sizes: list[int] = []
    for node in nodes:
        if isinstance(node, Field):
            sizes += payload_sizes(node.nodes)
        elif isinstance(node, Payload):
            sizes.append(len(node.data))
    return sizes


def field_pieces(number: int, pieces: Sequence[Piece]) -> list[Piece]:
    """A length-delimited field (an embedded message or bytes) holding the given pieces."""
    size = sum(len(p) for p in pieces)
    return [_varint(number << 3 | _LENGTH_DELIMITED) + _varint(size), *pieces]


def field_number(message: type, name: str) -> int:
    return message.DESCRIPTOR.fields_by_name[name].number  # type: ignore[attr-defined]


_PIXEL_VALUES = field_number(pb.MultimodalInputs, "pixel_values")
_MODEL_SPECIFIC_TENSORS = field_number(pb.MultimodalInputs, "model_specific_tensors")
_INLINE = field_number(pb.TensorData, "inline")
_SHM = field_number(pb.TensorData, "shm")
_MAP_KEY, _MAP_VALUE = 1, 2  # a map entry is a message {key = 1; value = 2}
_LENGTH_DELIMITED = 2  # the wire type of bytes, strings and embedded messages


def _tensor_nodes(array: np.ndarray, dtype: str | None) -> list[Node]:
    name, array = _wire_array(array, dtype)
    head = pb.TensorData(shape=list(array.shape), dtype=name).SerializeToString()
    data = memoryview(array).cast("B") if array.size else b""  # (cast refuses a 0 in the shape)
    return [head, Payload(data)]


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _message(
    processed: ProcessedItems,
    ranges: Sequence[tuple[int, int]],
    hashes: Sequence[str],
    modality: Modality,
    **tensors: object,
) -> pb.MultimodalInputs:
    """The message: every field but the tensors, and the tensors given here, if any."""
    mm = pb.MultimodalInputs(
        **tensors,
        mm_placeholders=[pb.PlaceholderRange(offset=o, length=n) for o, n in ranges],
        mm_hashes=list(hashes),
        batched_keys=list(processed.batched_keys),
        flat_keys=dict(processed.flat_keys),
        keep_on_cpu_keys=list(processed.keep_on_cpu_keys),
        modality=MODALITIES[modality],
    )
    if processed.embed_token_id is not None:
        mm.im_token_id = processed.embed_token_id
    if processed.encoder_key != PRIMARY_KEY:
        mm.encoder_input_key = processed.encoder_key
    return mm
