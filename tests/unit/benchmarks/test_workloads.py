"""The benchmark's request bodies: each varied kind really differs per request (a gateway
cache must not be able to answer one from an earlier one) and is the same on a rerun."""

from __future__ import annotations

import json
from io import BytesIO

import numpy as np
from PIL import Image

from benchmarks.workloads import LARGE, SMALL, body_maker, distinct_jpeg, messages_for


def _pixels(jpeg: bytes) -> np.ndarray:
    return np.asarray(Image.open(BytesIO(jpeg)).convert("RGB"))


def test_distinct_jpegs_decode_to_the_same_size_and_different_pixels() -> None:
    for size in (SMALL, LARGE):
        images = [distinct_jpeg(size, i) for i in range(4)]
        pixels = [_pixels(image) for image in images]
        assert all(p.shape == (size[1], size[0], 3) for p in pixels)
        assert len(set(images)) == 4
        assert all(not np.array_equal(pixels[0], p) for p in pixels[1:])


def test_varied_kinds_differ_per_request_and_repeat_on_a_rerun() -> None:
    for kind in ("chat", "photo"):
        make = body_maker(kind, "m", True, 16, clients=4)
        bodies = [json.dumps(make(client, seq)) for client in range(4) for seq in range(5)]
        assert len(set(bodies)) == len(bodies), kind
        again = body_maker(kind, "m", True, 16, clients=4)
        assert json.dumps(again(2, 3)) == bodies[2 * 5 + 3]


def test_a_conversation_resends_its_two_images_with_a_growing_history() -> None:
    turns = [messages_for("turns", 1, seq, clients=4) for seq in range(4)]
    assert [len(t) for t in turns[:3]] == [1, 3, 5]
    first = [json.dumps(t[0]) for t in turns]
    assert first[0] == first[1] == first[2] != first[3]  # the 4th request: a new conversation
    parts = turns[0][0]["content"]
    assert [p["type"] for p in parts] == ["image_url", "image_url", "text"]


def test_fixed_kinds_send_one_body() -> None:
    make = body_maker("text", "m", False, 16, clients=4)
    assert make(0, 0) is make(3, 7)
