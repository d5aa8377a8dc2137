"""Tokenizer bundles from workers are checked before anything is written where it is used."""

from __future__ import annotations

import hashlib
import io
import zipfile

import pytest

from gateway.render.bundle import BundleError, unpack_bundle


def bundle(files: dict[str, bytes]) -> tuple[bytes, str]:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    data = buffer.getvalue()
    return data, hashlib.sha256(data).hexdigest()


def test_unpacks_once_and_reuses(tmp_path):
    data, digest = bundle({"tokenizer.json": b"{}", "chat_template.jinja": b"x"})
    first = unpack_bundle(data, digest, tmp_path)
    assert (first / "chat_template.jinja").read_bytes() == b"x"
    (first / "chat_template.jinja").write_bytes(b"kept")
    assert unpack_bundle(data, digest, tmp_path) == first
    assert (first / "chat_template.jinja").read_bytes() == b"kept"


@pytest.mark.parametrize(
    "files",
    [
        {"tokenizer.json": b"{}", "../escape.txt": b"x"},
        {"tokenizer.json": b"{}", "sub/dir.txt": b"x"},
        {"config.json": b"{}"},  # no tokenizer
    ],
)
def test_refuses_unsafe_or_incomplete_bundles(tmp_path, files):
    data, digest = bundle(files)
    with pytest.raises(BundleError):
        unpack_bundle(data, digest, tmp_path)
    assert not (tmp_path / "escape.txt").exists()
    assert not list((tmp_path / "bundles").iterdir())


def test_refuses_a_digest_mismatch(tmp_path):
    data, _ = bundle({"tokenizer.json": b"{}"})
    with pytest.raises(BundleError, match="sha256"):
        unpack_bundle(data, "0" * 64, tmp_path)
