"""Mistral 3: images preprocessed by the gateway's Pixtral family equal vLLM's own OpenAI server
on a tiny random-weight Mistral3ForConditionalGeneration, a ragged batch (two images of
different sizes, sent padded and cut back per image by the worker) included; and the worker's
slot check, which sizes vLLM's replacement rule from the items' `image_sizes`, refuses a
placeholder one `[IMG]` short."""

from __future__ import annotations

import pytest

from tests.support.e2e_cases import IMAGE
from tests.support.family_e2e import ask, assert_slot_check_refuses, serve_both
from tests.support.pixtral_models import build_model

ENGINE = {"limit_mm_per_prompt": {"image": 2}}
# A request that fits its images into 56px: vLLM counts its tokens with the request's size.
SMALLER = {"mm_processor_kwargs": {"size": {"longest_edge": 56}}}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("mistral3")
    with serve_both(build_model(root / "model"), root, **ENGINE) as pair:
        yield pair


def test_images_equal_vllm_s_server(pair):
    assert pair.ours() == pair.reference()
    # the gateway preprocessed them itself
    assert "no image processor here" not in pair.gateway.log_path.read_text()


def test_a_request_s_size_is_served_with_vllm_s_count(pair):
    """vLLM's server takes per-request mm_processor_kwargs only with --trust-request-mm-kwargs,
    a server flag our worker does not share, so the reference is vLLM's own count: the prompt
    grows or shrinks by the difference of its replacements, and the worker's slot check (which
    asks the rule with the model's default size) takes the smaller grid."""
    from transformers import AutoConfig
    from vllm.model_executor.models.mistral3 import Mistral3HFEncoderInfo

    config = AutoConfig.from_pretrained(pair.model)

    def replacement(longest: int) -> int:
        info = Mistral3HFEncoderInfo(config, longest)
        cols, rows = info.get_patch_grid_size(image_width=IMAGE.width, image_height=IMAGE.height)
        return rows * (cols + 1)

    ((default, _),) = pair.reference([("one", [IMAGE])]).values()
    reply = ask(pair.gateway.client(), [IMAGE], str(pair.model), extra_body=SMALLER)
    longest = SMALLER["mm_processor_kwargs"]["size"]["longest_edge"]
    assert replacement(longest) < replacement(1540)
    assert reply.usage.prompt_tokens == default - replacement(1540) + replacement(longest)


def test_a_placeholder_one_embedding_short_is_refused_by_the_worker(pair):
    assert_slot_check_refuses(pair)
