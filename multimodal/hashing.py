"""Content hashes per media item that also cover every setting that changes its tensors.

SMG hashes only the encoded bytes, so an engine's encoder cache can hand back tensors made
with other per-request options (min/max pixels) or another pixel encoding. Folding those in
makes the hash a key that can never alias.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import blake3


def settings_fingerprint(family: str, options: Mapping[str, Any], pixel_encoding: str) -> bytes:
    return json.dumps([family, dict(options), pixel_encoding], sort_keys=True).encode()


def item_hash(data: bytes, fingerprint: bytes) -> str:
    hasher = blake3.blake3(fingerprint)
    hasher.update(b"\0")
    hasher.update(data)
    return hasher.hexdigest()
