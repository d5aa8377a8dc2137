"""Qwen3.5 (dense and MoE): images preprocessed by the gateway's Qwen-VL family equal vLLM's
own OpenAI server on tiny random-weight models (bfloat16, as vLLM runs Qwen3.5 on a CPU).

Videos too, on the dense model (multimodal/processors/qwen3_vl_video.py; the cases are
Qwen3-VL's, tests/support/qwen3_vl_video_e2e.py): the same prompt token counts, greedy text,
tokens and logprobs, through a second gateway on the same worker run with `--mm-processing
gateway`, so a video it could not preprocess itself would be a 400, not a worker fallback.
The video tests share the image tests' engines (each start costs ~30-40 s), so both engines
allow two videos beside the images; the limits are the same on vLLM's server and our worker,
so the image comparisons are unchanged."""

from __future__ import annotations

import dataclasses

import pytest

from tests.support.family_e2e import answers, assert_slot_check_refuses, serve_both
from tests.support.gateway_process import GatewayProcess
from tests.support.qwen3_vl_video_e2e import (
    CASES,
    GATEWAY_ARGS,
    answer_texts,
    assert_preprocessed_here_equals_vllm,
    make_clips,
)
from tests.support.qwen35_models import build_model
from tests.support.smg import run_smg, smg_client

ENGINE = {"dtype": "bfloat16", "limit_mm_per_prompt": {"image": 2, "video": 2}}


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


# The video tests run on the dense model only: the same engines as the image tests' "dense".
ON_DENSE = pytest.mark.parametrize("pair", ["dense"], indirect=True)


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, str]:
    return make_clips(tmp_path_factory.mktemp("clips"))


@pytest.fixture(scope="module")
def video_pair(pair, tmp_path_factory):
    """The pair's engines behind a gateway that preprocesses all media itself."""
    log = tmp_path_factory.mktemp("qwen35-video-gw") / "gateway.log"
    gateway = GatewayProcess(pair.model, [pair.worker.address], log, *GATEWAY_ARGS)
    try:
        yield dataclasses.replace(pair, gateway=gateway.wait_ready())
    finally:
        gateway.stop()


@ON_DENSE
@pytest.mark.parametrize("case", list(CASES))
def test_a_video_preprocessed_by_the_gateway_equals_vllm_s_server(case, clips, video_pair):
    assert_preprocessed_here_equals_vllm(video_pair, CASES[case](clips))


@ON_DENSE
def test_the_answers_follow_the_video(clips, video_pair):
    """The tiny model's text depends on the frames, so the comparisons above see them."""
    texts = answer_texts(video_pair, clips)
    assert texts[0] != texts[1]
