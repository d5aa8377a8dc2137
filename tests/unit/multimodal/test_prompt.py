"""Placeholder expansion, the one place anchors become their items' tokens."""

from __future__ import annotations

import pytest

from multimodal.prompt import Placeholders, PromptError, expand

IMAGE, VIDEO = 90, 91


def test_each_anchor_takes_its_items_replacement_in_order():
    images = Placeholders("image", IMAGE, [[IMAGE] * 2, [IMAGE] * 3])
    ids, (ranges,) = expand([1, IMAGE, 2, IMAGE, 3], [images])
    assert ids == [1, IMAGE, IMAGE, 2, IMAGE, IMAGE, IMAGE, 3]
    assert ranges == [(1, 2), (4, 3)]


def test_modalities_interleave_and_keep_their_own_order():
    images = Placeholders("image", IMAGE, [[IMAGE] * 2, [7, IMAGE, 8]])
    videos = Placeholders("video", VIDEO, [[VIDEO] * 4])
    ids, (image_ranges, video_ranges) = expand([IMAGE, 5, VIDEO, 6, IMAGE], [images, videos])
    assert ids == [IMAGE, IMAGE, 5, VIDEO, VIDEO, VIDEO, VIDEO, 6, 7, IMAGE, 8]
    assert image_ranges == [(0, 2), (8, 3)] and video_ranges == [(3, 4)]


def test_a_count_mismatch_is_refused():
    with pytest.raises(PromptError, match="the prompt has 1 image placeholders for 2 images"):
        expand([IMAGE], [Placeholders("image", IMAGE, [[IMAGE], [IMAGE]])])
