"""Idefics3 and SmolVLM: images preprocessed by the gateway's Idefics3 family (tiles with
row/column markers and a global tile, LANCZOS as released) equal vLLM's own OpenAI server on
tiny random-weight Idefics3ForConditionalGeneration and SmolVLMForConditionalGeneration models
(prompt token counts and greedy text), the text depends on the image, and the worker's slot
check refuses a placeholder one `<image>` short.

Every image becomes up to 4x4 tiles plus the global one (the long edge resized to 4 tiles, up
or down): 169 tokens a tile for Idefics3, so two images run past 4000 prompt tokens.
"""

from __future__ import annotations

import pytest

from tests.support.e2e_cases import make_image
from tests.support.family_e2e import CASES, assert_slot_check_refuses, serve_both
from tests.support.idefics3_models import IDEFICS3, SMOLVLM, build_model

ENGINE = {"limit_mm_per_prompt": {"image": 2}, "max_model_len": 8192}
# Images of one size (the same tiles and prompt length) that differ only in their pixels.
SAME_SIZE = [(f"seed-{seed}", [make_image(150, 110, seed=seed)]) for seed in (21, 99, 5)]


@pytest.fixture(scope="module", params=[IDEFICS3, SMOLVLM], ids=lambda v: v.model_type)
def pair(request, tmp_path_factory):
    if request.param is SMOLVLM:
        pytest.importorskip("num2words", reason="vLLM's SmolVLM processor needs num2words")
    root = tmp_path_factory.mktemp(request.param.model_type)
    model = build_model(root / "model", variant=request.param)
    with serve_both(model, root, **ENGINE) as pair:
        yield pair


def test_images_equal_vllm_s_server(pair):
    cases = CASES + SAME_SIZE
    ours, reference = pair.ours(cases), pair.reference(cases)
    assert ours == reference
    # the gateway preprocessed them itself
    assert "no image processor here" not in pair.gateway.log_path.read_text()
    # A random model whose text ignores the image would prove nothing: one prompt length,
    # three images, three texts.
    same_size = [reference[name] for name, _ in SAME_SIZE]
    assert len({tokens for tokens, _ in same_size}) == 1
    assert len({text for _, text in same_size}) == len(SAME_SIZE), same_size


def test_a_placeholder_one_embedding_short_is_refused_by_the_worker(pair):
    assert_slot_check_refuses(pair)
