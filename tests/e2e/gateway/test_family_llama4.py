"""Llama 4: images preprocessed by the gateway's Llama 4 family (aspect-ratio tiles plus a global
tile, `<|patch|>` runs with tile separators inside each placeholder) equal vLLM's own OpenAI
server on a tiny random-weight Llama4ForConditionalGeneration. vLLM does not normalize this
model's pixels on device, so the gateway sends float32 holding transformers' bfloat16 values.

vLLM 0.32's CPU backend cannot encode an image of one tile: Llama4UnfoldConvolution hands a
transposed (1, patches, 588) view to oneDNN's matmul, which requires a unit last stride (more
tiles make the reshape copy). Any image that fits one 336px tile kills the engine core of
vLLM's own server as well as ours. So this module serves the model with the released
preprocessor settings but `resize_to_max_canvas` on (upscale to the largest canvas), under
which no image is a single tile: the shared CASES become 13-17 tiles an image, up to 4.9k
prompt tokens (max_model_len 8192).
"""

from __future__ import annotations

import json

import pytest

from tests.support.e2e_cases import make_image
from tests.support.family_e2e import CASES, ask, assert_slot_check_refuses, serve_both
from tests.support.llama4_models import build_model

ENGINE = {"limit_mm_per_prompt": {"image": 2}, "max_model_len": 8192}
PHOTO = make_image(640, 480, seed=3)  # 2x2 tiles by default, 3x4 on the largest canvas


def upscale_to_max_canvas(model):
    """Turn resize_to_max_canvas on where transformers, vLLM and the gateway read it."""
    flat = model / "preprocessor_config.json"
    flat.write_text(json.dumps({**json.loads(flat.read_text()), "resize_to_max_canvas": True}))
    nested = model / "processor_config.json"
    config = json.loads(nested.read_text())
    config["image_processor"]["resize_to_max_canvas"] = True
    nested.write_text(json.dumps(config))
    return model


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return upscale_to_max_canvas(build_model(tmp_path_factory.mktemp("llama4") / "model"))


@pytest.fixture(scope="module")
def pair(model, tmp_path_factory):
    with serve_both(model, tmp_path_factory.mktemp("llama4-logs"), **ENGINE) as pair:
        yield pair


@pytest.fixture(scope="module")
def reference(pair):
    return pair.reference()


def test_the_gateway_has_this_family(model):
    from gateway.render.model_files import ModelFiles
    from multimodal.processors.llama4 import Llama4Processor
    from multimodal.registry import processors_for

    processor = processors_for(ModelFiles.load(model)).get("image")
    assert type(processor) is Llama4Processor
    assert processor.resolve({}).resize_to_max_canvas


def test_images_equal_vllm_s_server(pair, reference):
    ours = pair.ours()
    print("prompt_tokens:", {name: tokens for name, (tokens, _) in ours.items()})
    assert ours == reference
    # the gateway preprocessed them itself
    assert "no image processor here" not in pair.gateway.log_path.read_text()


def test_the_tiny_model_answers_varied_text(reference):
    # Not one token repeated ("keep keep keep ..." at a larger vision initializer range), and
    # the answer depends on the images.
    texts = [text for _, text in reference.values()]
    assert len(set(texts)) == len(texts) == len(CASES)
    assert all(len(set(text)) > 8 for text in texts), texts


def test_a_request_s_canvas_option_is_served(pair, reference):
    """vLLM's server takes per-request mm_processor_kwargs only with --trust-request-mm-kwargs,
    a server flag our worker does not share; so the gateway's answer with the smallest canvas
    is checked against the count of transformers' own replacement: the prompt shrinks by the
    difference between the 3x4-tile and the 2x2-tile image's replacements."""
    from transformers import AutoProcessor

    hf = AutoProcessor.from_pretrained(pair.model)

    def replacement(ratio: tuple[int, int]) -> int:
        text = hf._prompt_split_image(aspect_ratio=ratio, num_patches_per_chunk=144)
        return len(hf.tokenizer(text, add_special_tokens=False)["input_ids"])

    largest = pair.reference([("photo", [PHOTO])])["photo"][0]
    smallest = {"mm_processor_kwargs": {"resize_to_max_canvas": False}}
    reply = ask(pair.gateway.client(), [PHOTO], str(pair.model), extra_body=smallest)
    assert reply.usage.prompt_tokens == largest - replacement((3, 4)) + replacement((2, 2))


def test_a_placeholder_one_embedding_short_is_refused_by_the_worker(pair):
    assert_slot_check_refuses(pair, PHOTO)


def test_smg_drives_our_worker_with_it(pair, tmp_path):
    """SMG 1.13 preprocesses Llama 4 itself and our worker takes its tensors: the prompt it
    builds has vLLM's length. Its text is not compared: SMG normalizes in float32 where
    transformers (and so vLLM) rounds through bfloat16, so its pixels differ by up to 0.004,
    and it ignores resize_to_max_canvas (images here are sent multi-tile either way)."""
    from tests.support.smg import run_smg, smg_client

    wide = [make_image(1280, 960, seed=9)]
    want = pair.reference([("photo", wide)])["photo"]
    with run_smg([pair.worker.address], tmp_path / "smg.log", "--mm-processing", "router") as base:
        client = smg_client(base)
        reply = ask(client, wide, client.models.list().data[0].id)
    assert reply.usage.prompt_tokens == want[0]
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 10
