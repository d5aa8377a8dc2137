"""TensorData (raw little-endian bytes + shape + dtype name) to torch, inline or via /dev/shm."""

from __future__ import annotations

import contextlib
import errno
import math
import os
import stat

import torch

from engine_server.errors import InvalidRequest

WIRE_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "uint8": torch.uint8,
    "int64": torch.int64,
    "int32": torch.int32,
    "uint32": torch.uint32,
}
SHM_DIR = "/dev/shm"


def tensor_from_proto(td, field: str) -> torch.Tensor:
    """Decode one TensorData; `field` names it in error messages."""
    dtype = WIRE_DTYPES.get(td.dtype)
    if dtype is None:
        raise InvalidRequest(
            f"{field}: unknown dtype {td.dtype!r} (expected one of {', '.join(WIRE_DTYPES)})"
        )
    shape = [int(d) for d in td.shape]
    expected = math.prod(shape) * dtype.itemsize
    payload = _payload(td, field, expected)
    if len(payload) != expected:
        raise InvalidRequest(
            f"{field}: {len(payload)} bytes do not match shape {shape} of {td.dtype} "
            f"({expected} bytes)"
        )
    if not payload:
        return torch.empty(shape, dtype=dtype)
    tensor = torch.frombuffer(bytearray(payload), dtype=dtype).reshape(shape)
    # uint32 has almost no kernels in torch; the values are sizes and ids, int64 holds them.
    return tensor.to(torch.int64) if dtype == torch.uint32 else tensor


def _payload(td, field: str, expected: int) -> bytes:
    kind = td.WhichOneof("payload")
    if kind == "inline" or kind is None:
        return td.inline
    if kind == "shm":
        return read_shm(td.shm, field, expected)
    raise InvalidRequest(f"{field}: payload transport {kind!r} is not supported by this worker")


def read_shm(handle, field: str, expected: int) -> bytes:
    """Read a same-host shared-memory payload with the checks SMG's servicer applies.

    The name must be a plain file name under /dev/shm, never followed through a symlink,
    a regular file, of exactly the announced length; the segment is unlinked once read.
    """
    name = handle.name.lstrip("/")
    if not name or "/" in name or name in (".", "..") or "\x00" in name:
        raise InvalidRequest(f"{field}: invalid shared-memory name {handle.name!r}")
    if int(handle.nbytes) != expected:
        raise InvalidRequest(
            f"{field}: shared-memory nbytes {handle.nbytes} do not match shape and dtype "
            f"({expected} bytes)"
        )
    path = os.path.join(SHM_DIR, name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise InvalidRequest(f"{field}: shared-memory segment {name!r} is a symlink") from None
        raise InvalidRequest(f"{field}: cannot open shared-memory {name!r}: {error}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InvalidRequest(f"{field}: shared-memory segment {name!r} is not a regular file")
        raw = os.pread(fd, int(handle.nbytes), int(handle.offset))
    finally:
        os.close(fd)
    # Only a segment that was read is ours to remove; the producer hands ownership over.
    _unlink_quietly(path)
    if len(raw) != int(handle.nbytes):
        raise InvalidRequest(
            f"{field}: shared-memory segment {name!r} holds {len(raw)} bytes at offset "
            f"{handle.offset}, expected {handle.nbytes}"
        )
    return raw


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
