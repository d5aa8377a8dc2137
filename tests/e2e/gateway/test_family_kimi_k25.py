"""Kimi-K2.5: images preprocessed by the gateway's Kimi-K2.5 family equal vLLM's own OpenAI
server on a tiny random-weight KimiK25ForConditionalGeneration (bfloat16, as vLLM runs its MLA
on a CPU): the same prompt token counts and greedy text, with the engines as vLLM 0.32 starts
them (pixels normalized on device: the gateway sends uint8) and with
--no-mm-device-do-normalize (the gateway sends normalized bfloat16). The model's one modality
is vLLM's `vision_chunk` (its limit key); the wire says IMAGE and our worker keys the items as
vLLM does. The worker's slot check counts grid_thws (vLLM's own rule needs the raw image) and
refuses a placeholder one token short.

SMG 1.13 preprocesses Kimi-K2.5 itself, always into normalized floats: it drives our worker
when that runs with --no-mm-device-do-normalize (as SMG's own log asks), and is refused (not
normalized twice) when the worker normalizes on device."""

from __future__ import annotations

import pytest

from tests.support.e2e_cases import IMAGE, make_image
from tests.support.family_e2e import CASES, assert_slot_check_refuses, serve_both
from tests.support.kimi_k25_models import build_model

ENGINE = {"dtype": "bfloat16", "limit_mm_per_prompt": {"vision_chunk": 2}}
ON_DEVICE, ON_HOST = "device-normalized", "host-normalized"
# IMAGE's size, other pixels: the same prompt, so a different answer is the image's doing.
TWIN = make_image(IMAGE.width, IMAGE.height, seed=99)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("kimi_k25") / "model")


@pytest.fixture(scope="module", params=[ON_DEVICE, ON_HOST])
def pair(request, model, tmp_path_factory):
    logs = tmp_path_factory.mktemp(f"kimi_k25-{request.param}")
    engine = {**ENGINE, "mm_device_do_normalize": request.param == ON_DEVICE}
    # Our worker also takes media_refs (vLLM's own processor on it), for a worker-mode gateway.
    worker = {"mm_processor": "inprocess"}
    with serve_both(model, logs, worker_extra=worker, **engine) as pair:
        pair.normalizes_on_device = engine["mm_device_do_normalize"]
        yield pair


@pytest.fixture(scope="module")
def reference(pair):
    return pair.reference([*CASES, ("twin", [TWIN])])


def test_the_gateway_has_this_family(model):
    from gateway.render.model_files import ModelFiles
    from multimodal.processors.kimi_k25 import KimiK25Processor
    from multimodal.registry import processors_for

    assert type(processors_for(ModelFiles.load(model)).get("image")) is KimiK25Processor


def test_images_equal_vllm_s_server(pair, reference):
    ours = pair.ours([*CASES, ("twin", [TWIN])])
    print("prompt_tokens:", {name: tokens for name, (tokens, _) in ours.items()})
    assert ours == reference
    # the gateway preprocessed them itself
    assert "no image processor here" not in pair.gateway.log_path.read_text()


def test_a_worker_mode_gateway_equals_vllm_s_server_too(pair, reference, tmp_path):
    """`mmgate serve --mm-processing worker`: vLLM's own Kimi processor runs on our worker
    (media_refs), the images handed to it as vision chunks, as vLLM's chat parser does."""
    from tests.support.family_e2e import answers
    from tests.support.gateway_process import GatewayProcess

    args = ("--mm-processing", "worker")
    gateway = GatewayProcess(pair.model, [pair.worker.address], tmp_path / "gw.log", *args)
    try:
        got = answers(gateway.wait_ready().client(), str(pair.model))
    finally:
        gateway.stop()
    assert got == {name: reference[name] for name, _ in CASES}


def test_the_tiny_model_answers_varied_text_that_depends_on_the_image(reference):
    texts = [text for _, text in reference.values()]
    assert len(set(texts)) == len(texts) == len(CASES) + 1
    assert all(len(set(text)) > 8 for text in texts), texts
    # Same prompt length, other pixels, other answer.
    assert reference["twin"][0] == reference["one"][0]
    assert reference["twin"][1] != reference["one"][1]


def test_the_worker_reports_the_vision_chunk_limit_as_the_image_limit(pair):
    from protos import vllm_engine_pb2 as pb

    info = pair.worker.stub().GetServerInfo(pb.GetServerInfoRequest(), timeout=10)
    assert info.mm_device_do_normalize == pair.normalizes_on_device
    assert info.multimodal_encoder_dtype == "bfloat16"
    assert "image=2" in info.mm_item_limits.split(",")


def test_three_images_are_refused_as_vllm_refuses_them(pair):
    import openai

    from tests.support.family_e2e import ask

    images = [IMAGE, TWIN, IMAGE]
    with pytest.raises(openai.BadRequestError) as theirs:
        ask(pair.vllm.client(), images, "tiny")
    with pytest.raises(openai.BadRequestError) as ours:
        ask(pair.gateway.client(), images, str(pair.model))
    assert "At most 2" in str(theirs.value) and "At most 2" in str(ours.value)


def test_a_placeholder_one_embedding_short_is_refused_by_the_worker(pair):
    assert_slot_check_refuses(pair)


def test_smg_drives_our_worker_with_it(pair, reference, tmp_path):
    """SMG 1.13 preprocesses Kimi-K2.5 itself (router mode). Our worker takes its tensors when
    it normalizes on the host; on device, it refuses SMG's floats with INVALID_ARGUMENT (a 400
    from SMG) instead of normalizing them twice. Only lengths are compared: SMG writes a Kimi
    image as a bare `<|media_pad|>`, not vLLM's placeholder with its media markers, so its
    prompt is those tokens shorter per image (and its text, all "reasoning" after the
    template's `<think>`, another answer); its pixels equal vLLM's within bfloat16 rounding."""
    import openai
    from transformers import AutoTokenizer

    from tests.support.family_e2e import ask
    from tests.support.smg import run_smg, smg_client

    tokenizer = AutoTokenizer.from_pretrained(pair.model)
    markers = tokenizer("<|media_begin|>image<|media_content|><|media_end|>")["input_ids"]
    with run_smg([pair.worker.address], tmp_path / "smg.log", "--mm-processing", "router") as base:
        client = smg_client(base)
        name = client.models.list().data[0].id
        if pair.normalizes_on_device:
            with pytest.raises(openai.BadRequestError, match="takes raw uint8 pixels"):
                ask(client, [IMAGE], name)
            return
        for case, images in CASES:
            reply = ask(client, images, name)
            assert reply.usage.completion_tokens == 10
            want = reference[case][0] - len(markers) * len(images)
            assert reply.usage.prompt_tokens == want, case
