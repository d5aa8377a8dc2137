"""Preprocessed images through our worker give vLLM's own image-path output (issue 2, item 2).

The tensors are computed here with transformers' processor (what vLLM runs internally), sent as
`mm_inputs`, and the greedy tokens compared with AsyncLLM fed the raw images. Both pixel
encodings: raw uint8 for an engine that normalizes on device (vLLM's default), normalized
floats for one started with --no-mm-device-do-normalize.
"""

from __future__ import annotations

from pathlib import Path

import blake3
import grpc
import numpy as np
import pytest
from vllm import SamplingParams

from protos import common_pb2
from protos import vllm_engine_pb2 as pb
from tests.support.e2e_cases import MM_LIMITS, chat_prompt, make_image
from tests.support.engines import ReferenceEngine, serve_worker

SIZES_KEY = "patches_per_image"  # per-image patch counts: the sizes tensor pixel_values is cut by


CASES = {
    "one-image": [make_image(120, 90, 1)],
    "two-mixed-sizes": [make_image(200, 300, 2), make_image(64, 64, 3)],
}


@pytest.fixture(scope="module")
def processor(vision_model):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(vision_model)


@pytest.fixture(scope="module")
def reference(vision_model):
    ref = ReferenceEngine(vision_model, limit_mm_per_prompt=MM_LIMITS)
    yield ref
    ref.close()


@pytest.fixture(scope="module")
def uint8_worker(vision_model, tmp_path_factory):
    yield from serve_worker(
        vision_model, tmp_path_factory, "vision-uint8", limit_mm_per_prompt=MM_LIMITS
    )


@pytest.fixture(scope="module")
def float_worker(vision_model, tmp_path_factory):
    yield from serve_worker(
        vision_model,
        tmp_path_factory,
        "vision-float",
        limit_mm_per_prompt=MM_LIMITS,
        mm_device_do_normalize=False,
    )


def tensor(array: np.ndarray) -> pb.TensorData:
    array = np.ascontiguousarray(array)
    return pb.TensorData(inline=array.tobytes(), shape=list(array.shape), dtype=str(array.dtype))


def mm_batch(out, ids, media, modality: str) -> pb.MultimodalInputs:
    """One modality's batch as the wire carries it, from the HF processor's output."""
    video = modality == "video"
    pixels = out["pixel_values_videos" if video else "pixel_values"]
    grid_key, sizes_key = (
        ("video_grid_thw", "patches_per_video") if video else ("image_grid_thw", SIZES_KEY)
    )
    grid = out[grid_key].astype(np.int64)
    pad = PAD_IDS[modality]
    return pb.MultimodalInputs(
        pixel_values=tensor(pixels),
        model_specific_tensors={grid_key: tensor(grid), sizes_key: tensor(grid.prod(axis=1))},
        batched_keys=[grid_key, sizes_key],
        flat_keys={"pixel_values": sizes_key},
        mm_placeholders=runs_of(ids, pad),
        mm_hashes=[blake3.blake3(np.asarray(m).tobytes()).hexdigest() for m in media],
        im_token_id=pad,
        modality=common_pb2.VIDEO if video else common_pb2.IMAGE,
    )


PAD_IDS = {"image": 3005, "video": 3006}  # <|image_pad|>, <|video_pad|> in the tiny tokenizer


def mm_request(processor, images, raw_pixels: bool, videos=()) -> pb.GenerateRequest:
    text = chat_prompt(processor, images, videos)
    kwargs = {"do_rescale": False, "do_normalize": False} if raw_pixels else {}
    media = {"images": images} if images else {}
    if videos:
        media["videos"] = list(videos)
    out = processor(text=[text], return_tensors="np", **media, **kwargs)
    ids = [int(i) for i in out["input_ids"][0]]
    batches = [mm_batch(out, ids, images, "image")] if images else []
    if videos:
        batches.append(mm_batch(out, ids, videos, "video"))
    return pb.GenerateRequest(
        request_id=f"mm-{len(images)}-{len(videos)}-{raw_pixels}",
        tokenized=pb.TokenizedInput(input_ids=ids, original_text=text),
        mm_inputs=batches[0],
        extra_mm_inputs=batches[1:],
        sampling_params=pb.SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
    )


def runs_of(ids: list[int], token: int) -> list[pb.PlaceholderRange]:
    ranges, start = [], None
    for i, t in enumerate([*ids, -1]):
        if t == token and start is None:
            start = i
        elif t != token and start is not None:
            ranges.append(pb.PlaceholderRange(offset=start, length=i - start))
            start = None
    return ranges


def output_ids(worker, request: pb.GenerateRequest) -> list[int]:
    (done,) = [r.complete for r in worker.stub().Generate(request, timeout=120)]
    return list(done.output_ids)


@pytest.fixture(scope="module")
def expected(reference, processor) -> dict[str, list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    return {
        name: list(
            reference.generate(
                {"prompt": chat_prompt(processor, images), "multi_modal_data": {"image": images}},
                params,
                f"ref-{name}",
            )
            .outputs[0]
            .token_ids
        )
        for name, images in CASES.items()
    }


def test_workers_report_their_pixel_contract(uint8_worker, float_worker):
    info = uint8_worker.stub().GetServerInfo(pb.GetServerInfoRequest())
    assert info.mm_device_do_normalize is True
    assert info.multimodal_encoder_dtype == "float32"
    info = float_worker.stub().GetServerInfo(pb.GetServerInfoRequest())
    assert info.mm_device_do_normalize is False
    assert "image=4" in info.mm_item_limits
    assert uint8_worker.stub().GetModelInfo(pb.GetModelInfoRequest()).supports_vision


@pytest.mark.parametrize("case", CASES)
def test_uint8_pixels_equal_vllm_image_path(uint8_worker, processor, expected, case):
    assert (
        output_ids(uint8_worker, mm_request(processor, CASES[case], raw_pixels=True))
        == expected[case]
    )


@pytest.mark.parametrize("case", CASES)
def test_float_pixels_equal_vllm_image_path(float_worker, processor, expected, case):
    assert (
        output_ids(float_worker, mm_request(processor, CASES[case], raw_pixels=False))
        == expected[case]
    )


def test_pixels_that_would_be_normalized_twice_are_refused(uint8_worker, float_worker, processor):
    images = CASES["one-image"]
    for worker, raw in ((uint8_worker, False), (float_worker, True)):
        with pytest.raises(grpc.RpcError) as err:
            output_ids(worker, mm_request(processor, images, raw_pixels=raw))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "mm_inputs.pixel_values" in err.value.details()
        assert "normaliz" in err.value.details()


def broken(processor, change) -> pb.GenerateRequest:
    request = mm_request(processor, CASES["two-mixed-sizes"], raw_pixels=True)
    change(request.mm_inputs, request)
    return request


BAD_INPUTS = {
    "unknown dtype": (lambda mm, r: setattr(mm.pixel_values, "dtype", "float128"), "dtype"),
    "bytes vs shape": (lambda mm, r: mm.pixel_values.shape.__setitem__(0, 7), "bytes"),
    "placeholder outside prompt": (
        lambda mm, r: setattr(mm.mm_placeholders[1], "offset", len(r.tokenized.input_ids)),
        "outside",
    ),
    "flat key without sizes": (lambda mm, r: mm.model_specific_tensors.pop(SIZES_KEY), SIZES_KEY),
    "sizes not batched": (lambda mm, r: mm.batched_keys.remove(SIZES_KEY), "batched_keys"),
    "token id past vocab": (lambda mm, r: r.tokenized.input_ids.append(10**6), "vocab"),
    "hash count": (lambda mm, r: mm.mm_hashes.append("x"), "mm_hashes"),
    # Without im_token_id a widened range claims one embedding too many: this used to kill
    # vLLM's engine core; the worker now refuses it before admission.
    "embedding slots": (
        lambda mm, r: (
            mm.ClearField("im_token_id"),
            mm.mm_placeholders[0].MergeFrom(
                pb.PlaceholderRange(length=mm.mm_placeholders[0].length + 1)
            ),
        ),
        "embedding positions",
    ),
}


@pytest.mark.parametrize("name", BAD_INPUTS)
def test_bad_multimodal_input_is_invalid_argument(uint8_worker, processor, name):
    change, mentions = BAD_INPUTS[name]
    with pytest.raises(grpc.RpcError) as err:
        output_ids(uint8_worker, broken(processor, change))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    assert mentions in err.value.details()
    assert uint8_worker.stub().HealthCheck(pb.HealthCheckRequest()).healthy


def test_items_over_the_engine_limit_are_refused(uint8_worker, processor):
    images = [make_image(56, 56, seed) for seed in range(MM_LIMITS["image"] + 1)]
    with pytest.raises(grpc.RpcError) as err:
        output_ids(uint8_worker, mm_request(processor, images, raw_pixels=True))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "limit" in err.value.details()


def test_multimodal_input_to_a_text_model_is_refused(text_worker, processor):
    request = mm_request(processor, CASES["one-image"], raw_pixels=True)
    with pytest.raises(grpc.RpcError) as err:
        output_ids(text_worker, request)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "no multimodal input" in err.value.details()
    assert text_worker.stub().HealthCheck(pb.HealthCheckRequest()).healthy


def test_the_pixels_reach_the_model(uint8_worker, processor, expected):
    # Guards the equality tests above: were the image ignored, they would pass vacuously.
    assert expected["one-image"] != expected["two-mixed-sizes"][: len(expected["one-image"])]
    other = [make_image(120, 90, seed=99)]
    assert (
        output_ids(uint8_worker, mm_request(processor, other, raw_pixels=True))
        != (expected["one-image"])
    )


def test_shared_memory_pixels_equal_inline(uint8_worker, processor, expected, tmp_path):
    request = mm_request(processor, CASES["one-image"], raw_pixels=True)
    pixels = request.mm_inputs.pixel_values
    name = f"mmgate-test-{id(request)}"
    path = Path("/dev/shm") / name
    path.write_bytes(b"pad" + pixels.inline)
    handle = common_pb2.ShmHandle(name=name, offset=3, nbytes=len(pixels.inline))
    request.mm_inputs.pixel_values.shm.CopyFrom(handle)
    assert request.mm_inputs.pixel_values.WhichOneof("payload") == "shm"
    assert output_ids(uint8_worker, request) == expected["one-image"]
    assert not path.exists(), "the worker unlinks a segment it has read"


def test_shared_memory_symlinks_and_traversal_are_refused(uint8_worker, processor, tmp_path):
    secret = tmp_path / "secret"
    secret.write_bytes(b"x" * 100)
    link = Path("/dev/shm") / f"mmgate-link-{id(secret)}"
    link.symlink_to(secret)
    try:
        for name in (link.name, "../etc/passwd"):
            request = mm_request(processor, CASES["one-image"], raw_pixels=True)
            size = len(request.mm_inputs.pixel_values.inline)
            request.mm_inputs.pixel_values.shm.CopyFrom(
                common_pb2.ShmHandle(name=name, offset=0, nbytes=size)
            )
            with pytest.raises(grpc.RpcError) as err:
                output_ids(uint8_worker, request)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "shared-memory" in err.value.details()
        assert secret.exists() and link.is_symlink()
    finally:
        link.unlink()


def test_image_and_video_in_one_request(uint8_worker, reference, processor):
    images = CASES["one-image"]
    frames = np.random.default_rng(5).integers(0, 255, (4, 56, 84, 3), dtype=np.uint8)
    request = mm_request(processor, images, raw_pixels=True, videos=[frames])
    assert request.extra_mm_inputs[0].modality == common_pb2.VIDEO
    prompt = {
        "prompt": chat_prompt(processor, images, [frames]),
        "multi_modal_data": {"image": images, "video": frames},
    }
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    want = list(reference.generate(prompt, params, "ref-video").outputs[0].token_ids)
    assert output_ids(uint8_worker, request) == want


def test_structural_tokens_in_the_range_are_masked_by_im_token_id(
    uint8_worker, processor, expected
):
    # Widen each range over the <|vision_end|> that follows it: with im_token_id set only the
    # pad positions take image embeddings, so the output must not change. (The start stays put:
    # Qwen2-VL's M-RoPE positions are computed from each range's offset.)
    request = mm_request(processor, CASES["two-mixed-sizes"], raw_pixels=True)
    for p in request.mm_inputs.mm_placeholders:
        p.length += 1
    assert output_ids(uint8_worker, request) == expected["two-mixed-sizes"]


@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float"])
@pytest.mark.parametrize("case", CASES)
def test_mmgate_preprocessing_equals_vllm_image_path(
    uint8_worker, float_worker, vision_model, processor, expected, case, raw
):
    """The multimodal package end to end: encoded bytes -> decode -> our processor -> wire."""
    import io

    from multimodal.media import LoadedImage, MediaPolicy, decode_image
    from multimodal.pipeline import PixelEncoding, prepare
    from tests.support import load_processor

    loaded = []
    for picture in CASES[case]:
        buffer = io.BytesIO()
        picture.save(buffer, format="PNG")
        data = buffer.getvalue()
        loaded.append(LoadedImage(decode_image(data, MediaPolicy()), data, "data", "image/png"))
    prompt_ids = processor.tokenizer(chat_prompt(processor, CASES[case]))["input_ids"]
    groups = [(load_processor(vision_model), loaded)]
    prepared = prepare(groups, prompt_ids, {}, PixelEncoding(raw))
    request = pb.GenerateRequest(
        request_id=f"mmgate-{case}-{raw}",
        tokenized=pb.TokenizedInput(input_ids=prepared.prompt_ids),
        mm_inputs=prepared.mm_inputs[0],
        sampling_params=pb.SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
    )
    worker = uint8_worker if raw else float_worker
    assert output_ids(worker, request) == expected[case]
