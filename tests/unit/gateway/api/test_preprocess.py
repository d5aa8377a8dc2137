"""POST /v1/preprocess's service on the tiny Qwen2-VL model: per image what the gateway made of
it, agreeing with the prompt it builds for chat; bad input refused as chat refuses it."""

from __future__ import annotations

import asyncio
import base64

import numpy as np
import pytest

from gateway.api.preprocess import PreprocessService
from gateway.errors import MmgateError
from gateway.render.model_files import ModelFiles
from gateway.render.prompt import PromptBuilder
from gateway.render.renderer import ChatRenderer
from gateway.workers.worker import WorkerFacts
from multimodal.item_facts import item_grid, item_tensors, placeholder_counts
from multimodal.media import MediaPolicy
from multimodal.pipeline import PixelEncoding
from multimodal.processors.base import ProcessedItems
from multimodal.registry import processors_for
from tests.support.e2e_cases import make_image, png_bytes


def facts(**over) -> WorkerFacts:
    given = dict(
        model_path="m",
        served_model_name="m",
        max_context_length=1024,
        vocab_size=1,
        eos_token_ids=[],
        supports_vision=True,
        is_generation=True,
        pixels=PixelEncoding(raw=True),
        mm_item_limits={"image": 2},
    )
    return WorkerFacts(**{**given, **over})


def service(model, **over) -> PreprocessService:
    files = ModelFiles.load(model)
    processors = processors_for(files)
    prompts = PromptBuilder(ChatRenderer(files, processors.placeholders), processors, MediaPolicy())
    return PreprocessService("m", prompts, facts(**over))


def data_uri(image) -> str:
    return "data:image/png;base64," + base64.b64encode(png_bytes(image)).decode()


def ask(svc: PreprocessService, *urls: str, **fields) -> dict:
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    content = [*parts, {"type": "text", "text": "What is this?"}]
    body = {"messages": [{"role": "user", "content": content}], **fields}
    return asyncio.run(svc.preprocess(body))


def test_each_image_is_described_as_the_prompt_holds_it(vision_model):
    wide, small = make_image(300, 90, seed=1), make_image(60, 60, seed=2)
    reply = ask(service(vision_model), data_uri(wide), data_uri(small))
    assert (reply["processed_by"], reply["family"], reply["family_title"]) == (
        "gateway",
        "qwen_vl",
        "Qwen-VL",
    )
    assert reply["pixels"] == "uint8"
    first, second = reply["images"]
    assert (first["index"], first["width"], first["height"]) == (0, 300, 90)
    assert (second["width"], second["height"], second["mime"]) == (60, 60, "image/png")
    assert first["bytes"] == len(png_bytes(wide))
    for image in reply["images"]:
        t, h, w = image["grid"]["image_grid_thw"]
        # Qwen-VL: one patch row per grid cell, one token per 2x2 cells
        assert image["grid"]["patches_per_image"] == t * h * w
        assert image["tokens"] == image["embeddings"] == t * h * w // 4
        assert image["placeholder"]["length"] == image["tokens"]
        assert image["tensors"]["pixel_values"]["shape"][0] == t * h * w
        assert image["tensors"]["pixel_values"]["dtype"] == "uint8"
        assert image["tensors"]["image_grid_thw"]["shape"] == [3]
        assert len(image["hash"]) == 64
    assert second["placeholder"]["offset"] > first["placeholder"]["offset"] + first["tokens"]
    assert reply["prompt_tokens"] > first["tokens"] + second["tokens"]


def test_float_pixels_are_described_in_the_dtype_they_travel_in(vision_model):
    svc = service(vision_model, pixels=PixelEncoding(raw=False, float_dtype="bfloat16"))
    (image,) = ask(svc, data_uri(make_image(64, 64, seed=3)))["images"]
    assert image["tensors"]["pixel_values"]["dtype"] == "bfloat16"
    assert image["tensors"]["image_grid_thw"]["dtype"] == "int64"


def test_no_images_is_just_the_prompt_length(vision_model):
    reply = asyncio.run(
        service(vision_model).preprocess({"messages": [{"role": "user", "content": "hi"}]})
    )
    assert reply["images"] == [] and reply["processed_by"] is None
    assert reply["prompt_tokens"] > 0 and reply["family"] == "qwen_vl"


@pytest.mark.parametrize(
    ("urls", "says"),
    [
        (["data:image/png;base64,AAAA"], "invalid image: image 0:"),
        (["GOOD", "data:image/png;base64," + "iVBORw0KGgo" * 4], "invalid image: image 1:"),
        (["GOOD", "GOOD", "GOOD"], "At most 2 image(s) may be provided in one prompt."),
    ],
)
def test_bad_images_are_refused_as_chat_refuses_them(vision_model, urls, says):
    good = data_uri(make_image(32, 32, seed=4))
    with pytest.raises(MmgateError) as refused:
        ask(service(vision_model), *(good if u == "GOOD" else u for u in urls))
    assert refused.value.status == 400 and says in refused.value.message
    assert refused.value.param == "messages"


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"messages": []}, 400, "messages"),
        ({"messages": [{"role": "user", "content": "hi"}], "model": "other"}, 404, "model"),
        ({"messages": [{"role": "user", "content": "hi"}], "chat_template": "x"}, 400, None),
        ({"messages": "hi"}, 400, "messages"),
    ],
)
def test_bad_bodies_are_4xx_naming_the_field(vision_model, body, status, param):
    with pytest.raises(MmgateError) as refused:
        asyncio.run(service(vision_model).preprocess(body))
    assert refused.value.status == status
    if param is not None:
        assert refused.value.param == param


def test_a_worker_without_vision_refuses_images(vision_model):
    with pytest.raises(MmgateError, match="does not accept images"):
        ask(service(vision_model, supports_vision=False), data_uri(make_image(8, 8, seed=5)))


def test_item_shares_follow_the_batch_layout():
    processed = ProcessedItems(
        tensors={
            "flat": np.arange(10 * 2).reshape(10, 2),
            "counts": np.array([3, 7]),
            "padded": np.zeros((2, 3, 8, 8)),
            "extents": np.array([[4, 8], [8, 2]]),
            "shared": np.ones(5),
        },
        batched_keys=("counts", "extents"),
        flat_keys={"flat": "counts", "padded": "extents"},
    )
    second = item_tensors(processed, 1)
    assert second["flat"].tolist() == np.arange(6, 20).reshape(7, 2).tolist()
    assert second["padded"].shape == (3, 8, 2)
    assert item_tensors(processed, 0)["padded"].shape == (3, 4, 8)
    assert second["shared"].shape == (5,)
    assert item_grid(processed, second) == {"counts": 7, "extents": [8, 2]}


def test_placeholder_counts_tell_structural_tokens_apart():
    ids = [1, 9, 5, 5, 9, 5, 2]
    assert placeholder_counts(ids, (1, 5), None) == (5, 5)
    assert placeholder_counts(ids, (1, 5), 5) == (5, 3)


def test_each_video_says_which_frames_its_loader_picked(vision_model, tmp_path):
    from tests.support.video_e2e import data_uri as clip_uri
    from tests.support.video_e2e import jpeg_frames, make_clip

    clip = clip_uri(make_clip(tmp_path, "a.avi", 17, (70, 94), 2.4, "MJPG", 1), "video/x-msvideo")
    still = data_uri(make_image(40, 30, seed=5))
    parts = [
        {"type": "video_url", "video_url": {"url": clip}},
        {"type": "image_url", "image_url": {"url": still}},
        {"type": "video_url", "video_url": {"url": jpeg_frames(3, (64, 48), 2)}},
    ]
    body = {"messages": [{"role": "user", "content": parts}]}
    reply = asyncio.run(service(vision_model, mm_item_limits={}).preprocess(body))
    assert reply["processed_by"] == "gateway" and reply["video_family"] == "qwen_vl_video"
    assert len(reply["images"]) == 1 and reply["images"][0]["width"] == 40
    first, second = reply["videos"]
    # vLLM's Qwen2 loader at 2 fps: 15 of 17 frames at 2.4 fps, ending on the last
    assert first["frames"] == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 12, 13, 14, 15, 16]
    assert (first["total_frames"], first["fps"], first["mime"]) == (17, 2.4, "video/x-msvideo")
    assert first["seconds"][:3] == [0.0, round(1 / 2.4, 3), round(2 / 2.4, 3)]
    assert (first["width"], first["height"]) == (70, 94)
    t, h, w = first["grid"]["video_grid_thw"]
    assert t == 8  # 15 frames padded to 16, two per temporal patch
    assert first["tokens"] == first["embeddings"] == t * h * w // 4
    assert first["tensors"]["pixel_values"]["shape"][0] == t * h * w
    # a frame list is every frame, at 1 fps, as vLLM reports it
    assert (second["frames"], second["fps"], second["mime"]) == ([0, 1, 2], 1.0, "video/jpeg")
    assert first["placeholder"]["offset"] < reply["images"][0]["placeholder"]["offset"]
