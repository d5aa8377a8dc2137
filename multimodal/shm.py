"""Same-host /dev/shm segments for tensor payloads (TensorData.shm), written by the gateway
and read once, then unlinked, by the engine worker (engine_server.tensors.read_shm).

Standard library only: both the gateway (no torch) and the engine import it, so they compute
the /dev/shm identity the same way.
"""

from __future__ import annotations

import contextlib
import os
import secrets

SHM_DIR = "/dev/shm"
PREFIX = "mmgate-"
BOOT_ID = "/proc/sys/kernel/random/boot_id"


def shm_namespace_id(shm_dir: str = SHM_DIR, boot_id: str = BOOT_ID) -> str:
    """`<boot_id>:<st_dev of /dev/shm>` ("" when either is unknown). Two processes share
    /dev/shm when both match: the boot id pins the host (it is not namespaced), st_dev the
    tmpfs behind the mount, the same in containers that share it (--ipc=host, a bind mount)."""
    try:
        with open(boot_id) as f:
            boot = f.read().strip()
        return f"{boot}:{os.stat(shm_dir).st_dev}" if boot else ""
    except OSError:
        return ""


def segment_name() -> str:
    """Unguessable (128 random bits): another local user cannot plant or race a segment."""
    return PREFIX + secrets.token_hex(16)


def write_segment(data: bytes | memoryview, shm_dir: str = SHM_DIR) -> str:
    """A new segment holding `data`; its name. Created exclusively (never an existing file,
    never through a symlink), readable by this user only; on any failure (a full tmpfs:
    ENOSPC) nothing is left behind and the OSError is raised."""
    name = segment_name()
    path = os.path.join(shm_dir, name)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, 0o600)
    try:
        view = memoryview(data).cast("B")
        while view:  # write() may write less than asked (signals, Linux's 2 GiB cap)
            view = view[os.write(fd, view) :]
    except BaseException:
        os.close(fd)
        unlink_segment(name, shm_dir)
        raise
    os.close(fd)
    return name


def unlink_segment(name: str, shm_dir: str = SHM_DIR) -> bool:
    """Remove a segment this process wrote; False when it was gone already (the worker read
    it: reading hands it over)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(shm_dir, name))
        return True
    return False
