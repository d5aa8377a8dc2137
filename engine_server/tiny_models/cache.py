"""The named demo models (text, vision, embedding) and the cache they are built into once."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from engine_server.tiny_models.bert import build_embedding_model
from engine_server.tiny_models.qwen import build_text_model, build_vision_model

# Bump whenever the produced files change so stale caches are never reused.
BUILD_VERSION = "2"
KINDS = ("text", "vision", "embedding")

_BUILDERS: dict[str, Callable[[Path], Path]] = {
    "text": build_text_model,
    "vision": build_vision_model,
    "embedding": build_embedding_model,
}


def default_cache_root() -> Path:
    """`$MMGATE_CACHE/models` (default ~/.cache/mmgate/models). The gateway keeps model files
    from workers' bundles beside it, in `bundles/` (gateway.render.bundle.cache_root)."""
    env = os.environ.get("MMGATE_CACHE")
    return (Path(env).expanduser() if env else Path.home() / ".cache" / "mmgate") / "models"


def ensure_model(kind: str, cache_root: Path | None = None) -> Path:
    """Return cache_root/<kind>-<BUILD_VERSION>, building it on first use."""
    builder = _BUILDERS.get(kind)
    if builder is None:
        raise ValueError(f"unknown model kind {kind!r}; expected one of {KINDS}")
    root = Path(cache_root) if cache_root is not None else default_cache_root()
    final = root / f"{kind}-{BUILD_VERSION}"
    # The final dir only ever appears via rename, so existing means complete.
    if final.is_dir():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=root))
    try:
        builder(tmp)
        tmp.chmod(0o755)  # mkdtemp makes it 0700; the cache may be shared
        try:
            os.rename(tmp, final)
        except OSError:
            # A concurrent builder won the race; its copy is identical.
            if not final.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
