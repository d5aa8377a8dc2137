"""Model files from a worker, for a gateway that has no copy of the model.

`--model` is a local directory, or any name (e.g. a hub id) when the gateway has no copy: then
the files come from a worker's GetTokenizer bundle (a zip, sha256-checked), unpacked once into
`$MMGATE_CACHE/bundles/<digest>` (default ~/.cache/mmgate), and read from there by
`ModelFiles.load` as any model directory.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

from gateway.errors import BundleError
from gateway.render.model_files import is_model_dir

log = logging.getLogger("mmgate.gateway")
MAX_BUNDLE_BYTES = 512 * 1024 * 1024


def cache_root() -> Path:
    """`$MMGATE_CACHE` (default ~/.cache/mmgate); tiny test models live in its `models/`."""
    env = os.environ.get("MMGATE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "mmgate"


def unpack_bundle(data: bytes, digest: str, root: Path | None = None) -> Path:
    """The bundle's files in a directory of their own; reused when already unpacked."""
    if hashlib.sha256(data).hexdigest() != digest:
        raise BundleError("the worker's tokenizer bundle does not match its sha256")
    target = (root or cache_root()) / "bundles" / digest[:32]
    if is_model_dir(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".unpacking-"))
    try:
        _extract_flat(data, staging)
        if not is_model_dir(staging):
            raise BundleError("the worker's tokenizer bundle has no tokenizer.json")
        staging.rename(target)
    except OSError:
        if not is_model_dir(target):  # not just another gateway unpacking the same bundle
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("model files from the worker's tokenizer bundle in %s", target)
    return target


def _extract_flat(data: bytes, into: Path) -> None:
    """Plain file names only: nothing from the archive may land outside `into`."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        total = sum(info.file_size for info in archive.infolist())
        if total > MAX_BUNDLE_BYTES:
            raise BundleError(f"the tokenizer bundle unpacks to {total} bytes; refused")
        for info in archive.infolist():
            name = info.filename
            if info.is_dir() or "/" in name or "\\" in name or name in ("", ".", ".."):
                raise BundleError(f"unexpected entry {name!r} in the tokenizer bundle")
            (into / name).write_bytes(archive.read(info))
