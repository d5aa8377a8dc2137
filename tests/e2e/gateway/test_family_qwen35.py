"""Qwen3.5 (dense and MoE): images preprocessed by the gateway's Qwen-VL family equal vLLM's
own OpenAI server on tiny random-weight models (bfloat16, as vLLM runs Qwen3.5 on a CPU)."""

from __future__ import annotations

import pytest

from tests.support.family_e2e import answers, assert_slot_check_refuses, serve_both
from tests.support.qwen35_models import build_model
from tests.support.smg import run_smg, smg_client

ENGINE = {"dtype": "bfloat16", "limit_mm_per_prompt": {"image": 2}}


@pytest.fixture(scope="module", params=["dense", "moe"])
def pair(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"qwen35-{request.param}")
    model = build_model(root / "model", moe=request.param == "moe")
    with serve_both(model, root, **ENGINE) as pair:
        yield pair


def test_images_equal_vllm_s_server(pair):
    assert pair.ours() == pair.reference()
    # the gateway preprocessed them itself
    assert "no image processor here" not in pair.gateway.log_path.read_text()


def test_a_placeholder_one_embedding_short_is_refused_by_the_worker(pair):
    assert_slot_check_refuses(pair)


def test_smg_drives_our_worker_with_it(pair, tmp_path):
    """SMG 1.13 preprocesses Qwen3.5 itself (router mode) and our worker takes its tensors."""
    with run_smg([pair.worker.address], tmp_path / "smg.log", "--mm-processing", "router") as base:
        client = smg_client(base)
        assert answers(client, client.models.list().data[0].id) == pair.reference()
