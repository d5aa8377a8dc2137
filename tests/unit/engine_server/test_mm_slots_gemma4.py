"""The worker's Gemma 4 slot count (engine_server.mm_slots) is what the vision pooler embeds.

vLLM's own rule needs the raw image size and the request's max_soft_tokens, which never reach
the worker, so the worker counts from `pixel_position_ids`; here that count is checked against
transformers' Gemma4VisionPooler (which vLLM's Gemma 4 runs) on the gateway's tensors, and
against the gateway's own replacement, for every budget and the test images' shapes.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine_server.mm_slots import _pooled_blocks
from multimodal.processors.gemma4 import SUPPORTED_SOFT_TOKENS
from tests.support import load_processor
from tests.support.gemma4_models import build_model
from tests.support.synthetic_images import IMAGES


@pytest.fixture(scope="module")
def ours(tmp_path_factory):
    return load_processor(build_model(tmp_path_factory.mktemp("gemma4") / "m", weights=False))


@pytest.mark.parametrize("budget", SUPPORTED_SOFT_TOKENS)
def test_the_count_is_the_pooler_s(ours, budget):
    from transformers.models.gemma4.configuration_gemma4 import Gemma4VisionConfig
    from transformers.models.gemma4.modeling_gemma4 import Gemma4VisionPooler

    pooler = Gemma4VisionPooler(Gemma4VisionConfig(hidden_size=4))
    images = [np.asarray(i) for i in IMAGES.values()]
    got = ours.process(images, ours.resolve({"max_soft_tokens": budget}), raw_pixels=True)
    for positions, replacement in zip(got.tensors["pixel_position_ids"], got.replacements):
        positions = torch.from_numpy(positions)[None]
        padding = (positions == -1).all(dim=-1)
        _, valid = pooler(torch.zeros(1, len(positions[0]), 4), positions, padding, budget)
        embedded = int(valid.sum())
        assert _pooled_blocks(positions[0], 3) == embedded
        assert replacement.count(got.embed_token_id) == embedded


def test_a_short_grid_counts_fewer_blocks():
    # 6 x 3 patches (two blocks) then padding; and the same grid a row of blocks shorter
    grid = torch.tensor([[x, y] for y in range(6) for x in range(3)] + [[-1, -1]] * 9)
    assert _pooled_blocks(grid, 3) == 2
    assert _pooled_blocks(grid[:9], 3) == 1
