"""GetTokenizer: the model's tokenizer, config, chat template and processor files as one zip.

Streamed in 64 KiB chunks with the archive's sha256 on the last one, the framing SMG expects.
The archive is built once, off the event loop, and served from memory afterwards.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import zipfile
from collections.abc import Iterator
from pathlib import Path

from protos import common_pb2

CHUNK_SIZE = 64 * 1024
BUNDLE_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "config.json",
    "generation_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "chat_template.json",
    "preprocessor_config.json",
    "processor_config.json",
    "video_preprocessor_config.json",
)
BUNDLE_GLOBS = ("*.jinja", "*.model", "*.tiktoken")


def resolve_tokenizer_dir(tokenizer: str) -> Path:
    """A local directory for `tokenizer`: itself, or its snapshot in the local hub cache."""
    path = Path(tokenizer)
    if path.is_dir():
        return path
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(tokenizer, local_files_only=True))
    except Exception as error:
        raise FileNotFoundError(
            f"tokenizer {tokenizer!r} is neither a directory nor in the local hub cache"
        ) from error


def build_zip(directory: Path) -> bytes:
    names = [n for n in BUNDLE_FILES if (directory / n).is_file()]
    names += sorted(
        {p.name for g in BUNDLE_GLOBS for p in directory.glob(g) if p.is_file()} - set(names)
    )
    if not names:
        raise FileNotFoundError(f"no tokenizer files in {directory}")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in names:
            archive.write(directory / name, name)
    return buffer.getvalue()


def chunks(data: bytes) -> Iterator[common_pb2.GetTokenizerChunk]:
    digest = hashlib.sha256(data).hexdigest()
    for start in range(0, len(data), CHUNK_SIZE):
        end = min(start + CHUNK_SIZE, len(data))
        yield common_pb2.GetTokenizerChunk(
            data=data[start:end], sha256=digest if end == len(data) else ""
        )


class TokenizerBundle:
    def __init__(self, tokenizer: str) -> None:
        self._tokenizer = tokenizer
        self._data: bytes | None = None
        self._lock = asyncio.Lock()

    async def data(self) -> bytes:
        async with self._lock:
            if self._data is None:
                self._data = await asyncio.to_thread(self._build)
            return self._data

    def _build(self) -> bytes:
        return build_zip(resolve_tokenizer_dir(self._tokenizer))
