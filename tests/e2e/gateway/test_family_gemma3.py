"""Gemma 3: images preprocessed by the gateway's Gemma 3 family equal vLLM's own OpenAI server on
a tiny random-weight Gemma3ForConditionalGeneration (prompt token counts, with vLLM's newline
fusion around each image, and greedy text); a request with pan-and-scan crops is served with
vLLM's own count; and the worker's slot check, which counts `num_patches` x
mm_tokens_per_image (vLLM's rule needs the image size and the request's kwargs), refuses a
placeholder one `<image_soft_token>` short and takes a cropped image's full count."""

from __future__ import annotations

import grpc
import pytest

from tests.support.e2e_cases import make_image
from tests.support.family_e2e import (
    ask,
    assert_slot_check_refuses,
    data_uri,
    messages,
    serve_both,
    vllm_prompt_ids,
)
from tests.support.gemma3_models import IMAGE_SEQ_LENGTH, build_model

ENGINE = {"limit_mm_per_prompt": {"image": 2}}
PAN_AND_SCAN = {"do_pan_and_scan": True}
WIDE = make_image(1200, 400, seed=4)  # 3:1, so pan-and-scan cuts it into 3 crops of 400x400


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma3")
    with serve_both(build_model(root / "model"), root, **ENGINE) as pair:
        yield pair


def test_images_equal_vllm_s_server(pair):
    assert pair.ours() == pair.reference()
    # the gateway preprocessed them itself
    assert "no image processor here" not in pair.gateway.log_path.read_text()


def test_pan_and_scan_is_served_with_vllm_s_count(pair):
    images = [WIDE, make_image(150, 110, seed=21)]
    reply = ask(
        pair.gateway.client(),
        images,
        str(pair.model),
        extra_body={"mm_processor_kwargs": PAN_AND_SCAN},
    )
    want = vllm_prompt_ids(pair.model, images, PAN_AND_SCAN)
    assert reply.usage.prompt_tokens == len(want)
    assert reply.usage.completion_tokens == 10
    plain = ask(pair.gateway.client(), images, str(pair.model))
    # 3 crops of the wide image, each a 64-token image with its own structure, and the text.
    assert reply.usage.prompt_tokens > plain.usage.prompt_tokens + 3 * IMAGE_SEQ_LENGTH


def test_a_placeholder_one_embedding_short_is_refused_by_the_worker(pair):
    assert_slot_check_refuses(pair)


def test_the_slot_check_counts_a_cropped_image_s_patches(pair):
    """The worker takes a cropped image's 4 x 64 embeddings and refuses 4 x 64 - 1."""
    from gateway.render.model_files import ModelFiles
    from gateway.render.renderer import ChatRenderer
    from multimodal.media import MediaPolicy, decode_source
    from multimodal.pipeline import PixelEncoding, prepare
    from multimodal.registry import processors_for
    from protos import vllm_engine_pb2 as pb

    files = ModelFiles.load(pair.model)
    processors = processors_for(files)
    rendered = ChatRenderer(files, processors.placeholders).render(messages([WIDE]))
    info = pair.worker.stub().GetServerInfo(pb.GetServerInfoRequest(), timeout=10)
    encoding = PixelEncoding.for_engine(info.mm_device_do_normalize, info.multimodal_encoder_dtype)
    loaded = decode_source(data_uri(WIDE), None, MediaPolicy())
    processor = processors.get("image")
    prepared = prepare([(processor, [loaded])], rendered.token_ids, PAN_AND_SCAN, encoding)
    (mm,) = prepared.mm_inputs
    assert list(prepared.parts[0].processed.tensors["num_patches"]) == [4]

    def request(ids: list[int], inputs: pb.MultimodalInputs) -> pb.GenerateRequest:
        return pb.GenerateRequest(
            request_id=f"pan-and-scan-{len(ids)}",
            tokenized=pb.TokenizedInput(input_ids=ids),
            mm_inputs=inputs,
            sampling_params=pb.SamplingParams(temperature=0.0, max_tokens=2),
        )

    ids = list(prepared.prompt_ids)
    *_, done = pair.worker.stub().Generate(request(ids, mm), timeout=60)
    assert done.HasField("complete")
    placeholder = mm.mm_placeholders[0]
    del ids[ids.index(mm.im_token_id, placeholder.offset)]
    placeholder.length -= 1
    with pytest.raises(grpc.RpcError) as refused:
        list(pair.worker.stub().Generate(request(ids, mm), timeout=60))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"but the model's encoder produces {4 * IMAGE_SEQ_LENGTH}" in refused.value.details()
    assert pair.worker.stub().HealthCheck(pb.HealthCheckRequest(), timeout=10).healthy
