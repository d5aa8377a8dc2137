"""A vision family the gateway has no processor file for (LFM2-VL) answers exactly as vLLM's own
OpenAI server: `mmgate serve` leaves its images to `mmgate engine --mm-processor inprocess`
(media_refs), and the same holds with SMG in worker mode in front of our worker, and with our
gateway in front of SMG's own servicer (smg-grpc-servicer) in that mode."""

from __future__ import annotations

import openai
import pytest

from tests.support.e2e_cases import IMAGE
from tests.support.fallback_models import MODEL_TYPE, build_fallback_model
from tests.support.family_e2e import CASES, REFERENCE_NAME, answers, ask, media_ref_engines
from tests.support.gateway_process import GatewayProcess, read_chat_stream
from tests.support.smg import run_smg, smg_client

LIMITS = {"image": 3}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_fallback_model(tmp_path_factory.mktemp("lfm2-vl") / "model")


@pytest.fixture(scope="module")
def engines(model, tmp_path_factory):
    """vLLM's server, our worker and the upstream servicer, started at once (~25 s each)."""
    logs = tmp_path_factory.mktemp("fallback")
    with media_ref_engines(model, logs, limit_mm_per_prompt=LIMITS) as started:
        yield started


@pytest.fixture(scope="module")
def reference(engines):
    """vLLM's own answers: (prompt_tokens, text) per case."""
    return answers(engines["vllm"].client(), REFERENCE_NAME)


@pytest.fixture(scope="module")
def gateways(model, engines, tmp_path_factory):
    logs = tmp_path_factory.mktemp("fallback-gw")
    started = {
        name: GatewayProcess(model, [engines[name].address], logs / f"{name}.log")
        for name in ("ours", "upstream")
    }
    try:
        yield {name: gateway.wait_ready() for name, gateway in started.items()}
    finally:
        for gateway in started.values():
            gateway.stop()


def test_the_model_has_no_processor_file_here(model):
    from gateway.render.model_files import ModelFiles
    from multimodal.registry import processors_for

    files = ModelFiles.load(model)
    assert files.config["model_type"] == MODEL_TYPE
    assert "image" not in processors_for(files).by_modality


def test_our_gateway_and_worker_equal_vllm_s_server(gateways, reference, model):
    assert answers(gateways["ours"].client(), str(model)) == reference
    log = gateways["ours"].log_path.read_text()
    assert f"no image processor here for model_type '{MODEL_TYPE}'" in log
    assert "(1 of 1 workers take media" in log


def test_a_streamed_answer_equals_vllm_s_too(gateways, reference, model):
    stream = ask(
        gateways["ours"].client(),
        CASES[1][1],
        str(model),
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage, _ = read_chat_stream(stream)
    assert (usage.prompt_tokens, text) == reference["two-sizes"]
    assert finish == "length"


def test_our_gateway_drives_the_upstream_servicer_in_worker_mode(gateways, reference, model):
    assert answers(gateways["upstream"].client(), str(model)) == reference


def test_too_many_images_are_refused_as_vllm_refuses_them(gateways, model):
    with pytest.raises(openai.BadRequestError, match="At most 3 image"):
        ask(gateways["ours"].client(), [IMAGE] * 4, str(model))


def test_smg_in_worker_mode_drives_our_worker(engines, reference, tmp_path_factory):
    log = tmp_path_factory.mktemp("smg-fallback") / "smg.log"
    with run_smg([engines["ours"].address], log, "--mm-processing", "worker") as base:
        client = smg_client(base)
        assert answers(client, client.models.list().data[0].id) == reference
