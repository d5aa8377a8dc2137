"""The worker's media_refs settings and reference checks (before any fetch or engine)."""

from __future__ import annotations

import pytest

from engine_server.errors import InvalidRequest
from engine_server.media_refs import (
    DEFAULT_MAX_ITEM_BYTES,
    MediaRef,
    MediaRefSettings,
    inline_size,
    parse_media_refs,
)
from protos import common_pb2
from protos import vllm_engine_pb2 as pb

SCHEMES = frozenset({"http", "https", "data"})


def test_the_mode_comes_from_the_flag_then_the_environment_then_off():
    env = {"SMG_VLLM_MM_PROCESSOR": "inprocess"}
    assert MediaRefSettings.resolve("off", env=env) == MediaRefSettings("off", "flag")
    assert MediaRefSettings.resolve(None, env=env) == MediaRefSettings("inprocess", "env")
    assert MediaRefSettings.resolve(None, env={}) == MediaRefSettings("off", "default")
    assert MediaRefSettings.resolve(None, env={}).max_item_bytes == DEFAULT_MAX_ITEM_BYTES
    env = {"SMG_VLLM_MM_MAX_ITEM_BYTES": "1000"}
    assert MediaRefSettings.resolve("inprocess", env=env).max_item_bytes == 1000
    assert MediaRefSettings.resolve("inprocess", 7, env=env).max_item_bytes == 7


@pytest.mark.parametrize(
    ("mode", "items", "message"),
    [
        ("redis", None, r"--mm-processor / SMG_VLLM_MM_PROCESSOR='redis' is not one of off"),
        ("inprocess", 0, "must be positive"),
    ],
)
def test_bad_settings_are_refused(mode, items, message):
    with pytest.raises(ValueError, match=message):
        MediaRefSettings.resolve(mode, items, env={})


def test_a_bad_item_size_in_the_environment_is_named():
    with pytest.raises(ValueError, match="SMG_VLLM_MM_MAX_ITEM_BYTES='32M' is not a number"):
        MediaRefSettings.resolve("inprocess", env={"SMG_VLLM_MM_MAX_ITEM_BYTES": "32M"})


def refs(*items: tuple[int, str]) -> pb.MediaRefs:
    return pb.MediaRefs(items=[pb.MediaRef(modality=m, url=u) for m, u in items])


def test_references_keep_prompt_order_and_their_modality():
    parsed = parse_media_refs(
        refs((common_pb2.IMAGE, "data:image/png;base64,AA"), (common_pb2.VIDEO, "https://x/v")),
        SCHEMES,
    )
    assert parsed == [
        MediaRef("image", "data:image/png;base64,AA"),
        MediaRef("video", "https://x/v"),
    ]


@pytest.mark.parametrize(
    ("refs_", "message"),
    [
        (refs(), "carries no items"),
        (refs((common_pb2.IMAGE, "")), r"media_refs\[0\].url is empty"),
        (refs((common_pb2.IMAGE, "file:///a.png")), r"scheme 'file' is not accepted"),
        (refs((common_pb2.IMAGE, "/a.png")), r"scheme 'none' is not accepted"),
        (
            refs((common_pb2.IMAGE, "data:,"), (common_pb2.MODALITY_UNSPECIFIED, "x")),
            r"\[1\]: unsupported",
        ),
    ],
)
def test_bad_references_are_invalid_requests(refs_, message):
    with pytest.raises(InvalidRequest, match=message):
        parse_media_refs(refs_, SCHEMES)


def test_inline_size_is_the_decoded_payload():
    assert inline_size("data:image/png;base64,AAAA") == 3
    assert inline_size("data:text/plain,abc") == 3
    assert inline_size("https://x/a.png") is None
