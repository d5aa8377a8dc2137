"""Qwen3-VL and Qwen3.5 videos preprocessed by the gateway equal vLLM's own: clips decoded by
`multimodal.video.load_video` with the family's frames, processed by Qwen3VLVideoProcessor,
against vLLM's loader and processor run offline (tests/support/vllm_video.py) on the same
data: URIs. Tensors exactly (uint8 pixels, as vLLM gives them on this machine), normalized
pixels against transformers' own video processor, and the prompt ids after
`multimodal.pipeline.prepare` of the gateway's rendered chat."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from gateway.render.model_files import ModelFiles
from gateway.render.renderer import ChatRenderer
from multimodal.pipeline import PixelEncoding, prepare
from multimodal.policy import MediaPolicy
from multimodal.processors.base import VideoSampling
from multimodal.processors.qwen3_vl_video import (
    SIZES_KEY,
    Qwen3VLVideoProcessor,
    timestamps,
    video_smart_resize,
)
from multimodal.registry import processors_for
from multimodal.video import load_video
from tests.support import qwen3_vl_models, qwen35_models
from tests.support.video_e2e import data_uri, jpeg_frames, make_clip
from tests.support.vllm_video import vllm_video_inputs

# name: (frames, (width, height), fps, container)
CLIPS = {
    "mp4-odd-7-picked": (25, (90, 66), 7, "mp4"),
    "avi-3-frames": (3, (70, 94), 4, "avi"),
    "mp4-tiny-1fps-all-kept": (9, (33, 17), 1, "mp4"),
    "avi-large": (40, (200, 150), 12, "avi"),
    "mp4-30fps-thirds": (75, (64, 48), 30, "mp4"),
}
CONTAINERS = {"mp4": ("mp4v", "video/mp4"), "avi": ("MJPG", "video/x-msvideo")}
# A checkpoint whose video processor samples otherwise than vLLM's loader: every clip the
# loader keeps whole is sampled again by transformers (1 fps, at most 6 frames), and
# qwen-vl-utils' per-frame pixel cap binds (4 tokens a frame, floored at 1.05 x 4096 px).
RESAMPLING = {"fps": 1, "max_frames": 6, "cap_pixels_per_frame": True, "max_video_tokens": 4}


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("clips")
    uris = {}
    for seed, (name, (frames, size, fps, container)) in enumerate(CLIPS.items()):
        fourcc, mime = CONTAINERS[container]
        raw = make_clip(tmp, f"{name}.{container}", frames, size, fps, fourcc, seed)
        uris[name] = data_uri(raw, mime)
    uris["frame-list"] = jpeg_frames(5, (48, 40), seed=9)
    return uris


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("models")
    qwen3_vl = qwen3_vl_models.build_model(tmp / "qwen3_vl")
    resampling = tmp / "qwen3_vl_resampling"
    shutil.copytree(qwen3_vl, resampling)
    config = json.loads((resampling / "video_preprocessor_config.json").read_text())
    (resampling / "video_preprocessor_config.json").write_text(json.dumps({**config, **RESAMPLING}))
    return {
        "qwen3_vl": qwen3_vl,
        # no video_preprocessor_config.json: transformers falls back to the image's
        # (4 Ki to 64 Ki pixels here, so the large clip is scaled down)
        "qwen3_5": qwen35_models.build_model(tmp / "qwen3_5"),
        "qwen3_vl-resampling": resampling,
        "qwen3_vl_moe": qwen3_vl_models.build_model(tmp / "qwen3_vl_moe", moe=True),
        "qwen3_5_moe": qwen35_models.build_model(tmp / "qwen3_5_moe", moe=True),
    }


@pytest.fixture(scope="module", params=["qwen3_vl", "qwen3_5", "qwen3_vl-resampling"])
def case(request, model_dirs, clips) -> dict:
    """One model: its processor, every clip loaded by the gateway, and vLLM's reference for
    all clips in one chat and for the first alone."""
    model = model_dirs[request.param]
    files = ModelFiles.load(model)
    processor = processors_for(files).get("video")
    settings = processor.defaults
    loaded = [
        load_video(
            uri,
            None,
            MediaPolicy(),
            lambda t, f: processor.pick_frames(t, f, settings, VideoSampling()),
        )
        for uri in clips.values()
    ]
    uris = list(clips.values())
    return {
        "name": request.param,
        "model": model,
        "files": files,
        "processor": processor,
        "loaded": loaded,
        "uris": uris,
        "all": vllm_video_inputs(model, uris),
        "one": vllm_video_inputs(model, uris[:1]),
    }


def per_item(processed, count: int) -> list[dict[str, np.ndarray]]:
    """Our tensors cut into items, named as vLLM names them."""
    t = processed.tensors
    sizes = t[SIZES_KEY].tolist()
    pixels = np.split(t["pixel_values"], np.cumsum(sizes)[:-1])
    if "timestamps" in processed.batched_keys:
        stamps = list(t["timestamps"])
    else:
        frames = t[processed.flat_keys["timestamps"]].tolist()
        stamps = np.split(t["timestamps"], np.cumsum(frames)[:-1])
    return [
        {"pixel_values_videos": pixels[i], "video_grid_thw": t["video_grid_thw"][i],
         "timestamps": stamps[i]}
        for i in range(count)
    ]  # fmt: skip


def test_the_family_serves_the_qwen3_models_only(model_dirs):
    for model in model_dirs.values():
        files = ModelFiles.load(model)
        assert isinstance(processors_for(files).get("video"), Qwen3VLVideoProcessor)

    def files(model_type: str, video: dict) -> object:
        configs = {"config": {"model_type": model_type}, "video_preprocessor": video}
        return type("Files", (), {**configs, "preprocessor": {}})()

    for model_type in ("qwen2_vl", "qwen2_5_vl", "glm4v"):
        assert not Qwen3VLVideoProcessor.matches(files(model_type, {}))
    # another video processor class: vLLM would sample with another loader
    other = {"video_processor_type": "Qwen2VLVideoProcessor"}
    assert not Qwen3VLVideoProcessor.matches(files("qwen3_vl", other))
    assert Qwen3VLVideoProcessor.matches(files("qwen3_vl", qwen3_vl_models.VIDEO_PREPROCESSOR))


def test_every_tensor_equals_vllms(case):
    processor, loaded = case["processor"], case["loaded"]
    processed = processor.process([v.clip for v in loaded], processor.defaults, raw_pixels=True)
    ours = per_item(processed, len(loaded))
    theirs = case["all"]["video"]
    assert len(theirs) == len(ours)
    for name, mine, ref in zip(CLIPS | {"frame-list": 0}, ours, theirs, strict=True):
        assert set(ref) == set(mine), name
        assert mine["pixel_values_videos"].dtype == ref["pixel_values_videos"].dtype == np.uint8
        np.testing.assert_array_equal(mine["pixel_values_videos"], ref["pixel_values_videos"])
        np.testing.assert_array_equal(mine["video_grid_thw"], ref["video_grid_thw"], err_msg=name)
        # the wire has no float64: vLLM's Python floats, as float32
        np.testing.assert_array_equal(
            mine["timestamps"], ref["timestamps"].astype(np.float32), err_msg=name
        )
    # the clips have different frame counts: timestamps cut from a flat tensor by its sizes
    assert processed.flat_keys == {"pixel_values": SIZES_KEY, "timestamps": "frames_per_video"}


def test_one_clip_keeps_vllms_batched_timestamps(case):
    processor = case["processor"]
    processed = processor.process([case["loaded"][0].clip], processor.defaults, raw_pixels=True)
    assert "timestamps" in processed.batched_keys
    assert set(processed.keep_on_cpu_keys) == {"video_grid_thw", "timestamps"}
    (ref,) = case["one"]["video"]
    np.testing.assert_array_equal(
        processed.tensors["timestamps"][0], ref["timestamps"].astype(np.float32)
    )
    np.testing.assert_array_equal(processed.tensors["pixel_values"], ref["pixel_values_videos"])


def render(files: ModelFiles, processors, uris) -> list[int]:
    parts = [{"type": "video_url", "video_url": {"url": u}} for u in uris]
    chat = [{"role": "user", "content": [*parts, {"type": "text", "text": "Describe."}]}]
    return ChatRenderer(files, processors.placeholders).render(chat).token_ids


@pytest.mark.parametrize("which", ["one", "all"])
def test_prompt_ids_equal_vllms(case, which):
    files = case["files"]
    processors = processors_for(files)
    count = 1 if which == "one" else len(case["uris"])
    loaded = case["loaded"][:count]
    ids = render(files, processors, case["uris"][:count])
    prepared = prepare([(processors.get("video"), loaded)], ids, {}, PixelEncoding(raw=True))
    assert prepared.prompt_ids == case[which]["prompt_token_ids"]
    # each placeholder covers its replacement only: inside the template's own vision pair
    (part,) = prepared.parts
    model = case["processor"].model
    for (offset, length), replacement in zip(part.ranges, part.processed.replacements):
        assert prepared.prompt_ids[offset - 1] == model.vision_start_id
        assert prepared.prompt_ids[offset : offset + length] == replacement
        assert prepared.prompt_ids[offset + length] == model.vision_end_id


def test_normalized_pixels_equal_transformers(case):
    """vLLM gives uint8 here (it normalizes on device); the float path is held to
    transformers' own Qwen3VLVideoProcessor on the frames the uint8 test proved equal."""
    from transformers import AutoVideoProcessor

    processor = case["processor"]
    hf = AutoVideoProcessor.from_pretrained(case["model"])
    for video in case["loaded"]:
        (ours,) = per_item(processor.process([video.clip], processor.defaults, False), 1)
        frames, _, _ = processor._sampled(video.clip, processor.defaults)
        theirs = hf(videos=[frames], do_sample_frames=False, return_tensors="np")[
            "pixel_values_videos"
        ]
        assert ours["pixel_values_videos"].dtype == np.float32
        np.testing.assert_allclose(ours["pixel_values_videos"], theirs, rtol=0, atol=1e-6)


def test_timestamps_are_vllms_means_of_each_temporal_pair():
    # 7 frames at 7 fps: the odd last is repeated, so the last pair is one frame's time
    assert timestamps([0, 4, 8, 12, 16, 20, 24], 7.0, 2) == [
        (0 / 7 + 4 / 7) / 2, (8 / 7 + 12 / 7) / 2, (16 / 7 + 20 / 7) / 2, 24 / 7,
    ]  # fmt: skip


def test_video_smart_resize_counts_the_rounded_frames_in_the_budget():
    # 5 frames round (half to even) to 4 in the budget test, but beta uses the real 5
    assert video_smart_resize(5, 64, 64, 2, 32, 4096, 4 * 64 * 64) == (64, 64)
    assert video_smart_resize(5, 64, 64, 2, 32, 4096, 4 * 64 * 64 - 1) == (32, 32)
    # sides under the factor are scaled up first; fewer frames than the temporal patch fail
    assert video_smart_resize(4, 17, 33, 2, 32, 4096, 10**8) == (32, 64)
    with pytest.raises(Exception, match="at least 2"):
        video_smart_resize(1, 64, 64, 2, 32, 4096, 10**8)


@pytest.mark.parametrize("which", ["one", "all"])
def test_the_engine_takes_the_wire_as_vllms_items(case, which):
    """Our worker's side of the wire (engine_server.mm_inputs) turns the message into the
    items vLLM's processor makes: the same tensors per item (timestamps as float32, the model
    dtype here) and one embedding per `<|video_pad|>` of each replacement."""
    import torch

    from engine_server.mm_inputs import PixelContract, build_mm_prompt
    from multimodal.wire import multimodal_inputs

    files = case["files"]
    processors = processors_for(files)
    count = 1 if which == "one" else len(case["uris"])
    ids = render(files, processors, case["uris"][:count])
    loaded = case["loaded"][:count]
    prepared = prepare([(processors.get("video"), loaded)], ids, {}, PixelEncoding(raw=True))
    (part,) = prepared.parts
    mm = multimodal_inputs(part.processed, part.ranges, part.hashes, None, "video")
    prompt = build_mm_prompt(prepared.prompt_ids, [mm], PixelContract(True, torch.float32))
    items = prompt["mm_kwargs"]["video"]
    for item, want in zip(items, case[which]["video"], strict=True):
        assert set(item) - {SIZES_KEY, "frames_per_video"} == set(want)
        for key, value in want.items():
            np.testing.assert_array_equal(
                item[key].data.numpy(), value.astype(item[key].data.numpy().dtype), err_msg=key
            )
        assert item["timestamps"].field.__class__.__name__ == (
            "MultiModalBatchedField" if which == "one" else "MultiModalFlatField"
        )
    video_token = case["processor"].model.video_token_id
    for placeholder, replacement in zip(
        prompt["mm_placeholders"]["video"], part.processed.replacements
    ):
        assert placeholder.get_num_embeds() == replacement.count(video_token)


@pytest.mark.sampled  # each case asks vLLM's processor: a sample in the fast loop
@pytest.mark.parametrize("media_io", [{"fps": 1}, {"fps": 6}, {"fps": 3, "num_frames": 2}])
def test_a_request_s_sampling_equals_vllms(model_dirs, clips, media_io):
    """media_io_kwargs.video.fps: the Qwen3 loader's rate (num_frames it ignores)."""
    from tests.support.gateway_video import gateway_video_inputs

    model, uri = model_dirs["qwen3_vl"], [clips["mp4-30fps-thirds"]]
    want = vllm_video_inputs(model, uri, media_io_kwargs={"video": media_io})
    prepared = gateway_video_inputs(model, uri, True, media_io=media_io)
    assert prepared.prompt_ids == want["prompt_token_ids"]
    (item,) = want["video"]
    have = prepared.parts[0].processed.tensors["pixel_values"]
    assert np.array_equal(have, item["pixel_values_videos"])
