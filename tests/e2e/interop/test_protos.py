"""Our protos against smg-grpc-proto==0.4.28 (what SMG speaks): same descriptors, same bytes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from protos.generate import drifted_files
from tests.support import ROOT, wire_fill


def peer(command: str, package: str, stdin: str = "") -> object:
    """Run wire_fill in a fresh interpreter that loads only `package`."""
    result = subprocess.run(
        [sys.executable, "-m", "tests.support.wire_fill", command, package],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def upstream_encoded() -> list[dict]:
    return peer("encode", "smg_grpc_proto")


def test_generated_modules_match_the_proto_files():
    assert drifted_files() == [], "run: python -m protos.generate"


def test_file_descriptors_equal_upstream():
    ours = peer("descriptors", "protos")
    theirs = peer("descriptors", "smg_grpc_proto")
    assert set(ours) == {"common.proto", "vllm_engine.proto"} == set(theirs)
    for name in ours:
        assert ours[name] == theirs[name], f"{name} differs from smg-grpc-proto's"


def test_every_message_and_field_is_exercised():
    encoded = wire_fill.encode_all("protos")
    names = {e["type"] for e in encoded}
    assert "vllm.grpc.engine.GenerateRequest" in names and "smg.grpc.common.KvEventBatch" in names
    for cls in wire_fill.message_classes("protos").values():
        set_somewhere = set()
        for _, msg in wire_fill.variants(cls):
            set_somewhere |= {f.name for f, _ in msg.ListFields()}
        assert set_somewhere == set(cls.DESCRIPTOR.fields_by_name), cls.DESCRIPTOR.full_name


def test_ours_encode_upstream_decodes():
    ours = wire_fill.encode_all("protos")
    decoded = peer("decode", "smg_grpc_proto", json.dumps(ours))
    assert len(decoded) == len(ours)
    for sent, got in zip(ours, decoded):
        assert got["dict"] == sent["dict"], (sent["type"], sent["variant"])


def test_upstream_encodes_ours_decode(upstream_encoded):
    ours = wire_fill.decode_all("protos", upstream_encoded)
    assert len(ours) == len(upstream_encoded) > 40
    for sent, got in zip(upstream_encoded, ours):
        assert got["dict"] == sent["dict"], (sent["type"], sent["variant"])
