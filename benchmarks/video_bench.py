"""Time video preprocessing (decode the picked frames + the family's processor) against vLLM's
own path (its video loader + its multimodal processor, transformers' video processor inside).

    python -m benchmarks.video_bench [--repeats N] [--family NAME] [--quick]

Clips are made once with OpenCV (mp4v, moving gradients with noise): 10 s of 1280x720 and 60 s
of 854x480, both at 30 fps. Per family (the tiny test models' configs with the video
processor's released pixel limits: Qwen2-VL, Qwen3-VL, GLM-4.1V, LLaVA-OneVision; weights are
not loaded), it times:

* decode: ``video_decode.decode_picked_frames`` with the family's frame choice, alone: the
  floor both paths share (OpenCV reads every frame up to the last one picked);
* ours u8 / f32: ``multimodal.pipeline.decode_items`` + ``prepare`` (frames, patches, prompt
  expansion, hashes), uint8 (engines normalizing on device, vLLM's CPU default) and float32;
* vLLM: ``MediaConnector.fetch_video`` (the loader vLLM picks from the checkpoint's video
  processor) + ``processor.apply`` on the chat prompt, what ``vllm serve`` runs per request:
  uint8 where its engine normalizes on device (the Qwens, GLM), float32 otherwise
  (LLaVA-OneVision); checked equal to ours on the same path before timing, and the ratio
  taken against ours on that path.

The last column is the most any preprocessing could gain over vLLM while decoding the same
frames the same way (vLLM's ms over the decode's alone).

Single-threaded (BLAS/OpenMP env vars and torch threads forced to 1). The variants of a case
run interleaved, their order rotated each round; medians of ``--repeats`` rounds, ms.
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import base64  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

CLIPS = {"10s-720p": (10, (1280, 720)), "60s-480p": (60, (854, 480))}
FPS = 30
# transformers' Qwen2VLVideoProcessor defaults: what a Qwen2-VL / 2.5-VL checkpoint without
# its own video limits gets.
QWEN2_VIDEO_PIXELS = {"shortest_edge": 128 * 28 * 28, "longest_edge": 28 * 28 * 768}


def make_clip(path: Path, seconds: int, size: tuple[int, int]) -> bytes:
    import cv2

    width, height = size
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), FPS, size)
    rng = np.random.default_rng(seconds)
    # A textured scene panning across: detail for the resize, motion the codec can follow
    # (a few MB per clip, as real footage).
    blocks = rng.integers(0, 255, (height // 16 + 1, width // 16 + 2, 3), dtype=np.uint8)
    scene = cv2.resize(blocks, None, fx=16, fy=16, interpolation=cv2.INTER_CUBIC)
    for k in range(seconds * FPS):
        writer.write(np.ascontiguousarray(np.roll(scene, -2 * k, axis=1)[:height, :width]))
    writer.release()
    return path.read_bytes()


def family_models(root: Path) -> dict[str, Path]:
    """Model dirs per family, built as the tests build them (tiny weights, unused here), with
    the released video limits."""
    from engine_server.tiny_models import ensure_model
    from tests.support.glm4v_models import build_model as glm4v
    from tests.support.llava_onevision_models import build_model as llava_onevision
    from tests.support.qwen3_vl_models import build_model as qwen3_vl

    qwen2 = root / "qwen2_vl"
    shutil.copytree(ensure_model("vision", root / "cache"), qwen2)
    _set_video_pixels(qwen2, QWEN2_VIDEO_PIXELS)
    return {
        "qwen2_vl": qwen2,
        "qwen3_vl": qwen3_vl(root / "qwen3_vl"),
        "glm4v": glm4v(root / "glm4v", weights=False, tiny=False),
        "llava_onevision": llava_onevision(root / "llava_onevision", weights=False),
    }


def _set_video_pixels(model: Path, size: dict[str, int]) -> None:
    """The video processor's pixel limits, in both files transformers and the gateway read."""
    pixels = {"size": size, "min_pixels": size["shortest_edge"], "max_pixels": size["longest_edge"]}
    video = model / "video_preprocessor_config.json"
    video.write_text(json.dumps({**json.loads(video.read_text()), **pixels}))
    nested = model / "processor_config.json"
    config = json.loads(nested.read_text())
    config["video_processor"] = {**config.get("video_processor", {}), **pixels}
    nested.write_text(json.dumps(config))


class Ours:
    def __init__(self, model: Path) -> None:
        from gateway.render.model_files import ModelFiles
        from gateway.render.renderer import ChatRenderer
        from multimodal.registry import processors_for

        files = ModelFiles.load(model)
        processors = processors_for(files)
        self.processor = processors.get("video")
        messages = [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": "x"}}]}]
        renderer = ChatRenderer(files, processors.placeholders)
        self.prompt_ids = renderer.render(messages).token_ids

    def run(self, uri: str, raw: bool):
        from multimodal.media import MediaPolicy
        from multimodal.pipeline import PixelEncoding, decode_items, prepare

        settings = self.processor.defaults
        items = decode_items(self.processor, [uri], [None], settings, MediaPolicy())
        return prepare([(self.processor, items)], self.prompt_ids, {}, PixelEncoding(raw=raw))

    def decode(self, data: bytes):
        from multimodal.processors.base import VideoSampling
        from multimodal.video_decode import decode_picked_frames

        settings = self.processor.defaults
        return decode_picked_frames(
            data, lambda t, f: self.processor.pick_frames(t, f, settings, VideoSampling())
        )


class Vllm:
    def __init__(self, model: Path) -> None:
        from transformers import AutoTokenizer
        from vllm.config import ModelConfig
        from vllm.multimodal import MULTIMODAL_REGISTRY
        from vllm.multimodal.media.connector import MediaConnector
        from vllm.transformers_utils.processor import get_video_processor_cls_name

        config = ModelConfig(model=str(model), dtype="float32")
        self.processor = MULTIMODAL_REGISTRY.create_processor(config)
        self.connector = MediaConnector(media_io_kwargs={})
        self.loader = get_video_processor_cls_name(config)
        tokenizer = AutoTokenizer.from_pretrained(model)
        chat = [{"role": "user", "content": [{"type": "video"}]}]
        text = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        self.prompt_ids = tokenizer(text, add_special_tokens=False)["input_ids"]

    def run(self, uri: str):
        from vllm.multimodal.processing.context import TimingContext
        from vllm.multimodal.processing.inputs import ProcessorInputs

        video = self.connector.fetch_video(uri, video_processor=self.loader).media
        items = self.processor.info.parse_mm_data({"video": [video]})
        inputs = ProcessorInputs(self.prompt_ids, items, hf_processor_mm_kwargs={})
        return self.processor.apply(inputs, TimingContext(enabled=False))


def vllm_is_raw(theirs) -> bool:
    """Whether vLLM's processor left the pixels uint8 (its engine normalizes on device)."""
    (item,) = theirs["mm_kwargs"]["video"]
    return item["pixel_values_videos"].data.dtype == torch_uint8()


def torch_uint8():
    import torch

    return torch.uint8


def check_equal(ours, theirs) -> None:
    """Ours on vLLM's path equals vLLM's: ids exactly, uint8 exactly, floats within 1e-5."""
    (part,) = ours.parts
    (item,) = theirs["mm_kwargs"]["video"]
    got = part.processed.tensors["pixel_values"]
    want = item["pixel_values_videos"].data.float().numpy().reshape(got.shape)
    same = np.array_equal(got, want) if got.dtype == np.uint8 else np.allclose(got, want, atol=1e-5)
    if ours.prompt_ids != list(theirs["prompt_token_ids"]) or not same:
        raise SystemExit("ours and vLLM's differ: not timing")


def timed(variants: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    for run in variants.values():  # warm-up
        run()
    times: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for round_ in range(repeats):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            start = time.perf_counter()
            variants[name]()
            times[name].append((time.perf_counter() - start) * 1000)
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--family", help="one family (qwen2_vl, qwen3_vl, glm4v, llava_onevision)")
    parser.add_argument("--quick", action="store_true", help="the 10 s clip only, 3 rounds")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="video-bench-"))
    try:
        run(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(args: argparse.Namespace, root: Path) -> None:
    clips = {k: v for k, v in CLIPS.items() if not args.quick or k == "10s-720p"}
    repeats = 3 if args.quick else args.repeats
    data = {name: make_clip(root / f"{name}.mp4", *spec) for name, spec in clips.items()}
    sizes = ", ".join(f"{name} {len(raw) / 2**20:.1f} MiB" for name, raw in data.items())
    print(f"clips: {sizes}")
    uris = {k: "data:video/mp4;base64," + base64.b64encode(v).decode() for k, v in data.items()}
    models = family_models(root)
    print(
        "| family | clip | frames | grid or shape | decode | ours u8 | ours f32 | vLLM "
        "| vLLM / ours | ceiling: vLLM / decode |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for family, model in models.items():
        if args.family and family != args.family:
            continue
        ours, vllm = Ours(model), Vllm(model)
        for clip, uri in uris.items():
            print(row(family, clip, ours, vllm, data[clip], uri, repeats), flush=True)


def row(family: str, clip: str, ours: Ours, vllm: Vllm, data: bytes, uri: str, repeats: int) -> str:
    raw = vllm_is_raw(vllm.run(uri))
    check_equal(ours.run(uri, raw), vllm.run(uri))
    decoded = ours.decode(data)
    tensors = ours.run(uri, raw).parts[0].processed.tensors
    shape = tensors.get("video_grid_thw", np.asarray([tensors["pixel_values"].shape]))[0]
    ms = timed(
        {
            "decode": lambda: ours.decode(data),
            "u8": lambda: ours.run(uri, True),
            "f32": lambda: ours.run(uri, False),
            "vllm": lambda: vllm.run(uri),
        },
        repeats,
    )
    path = "u8" if raw else "f32"
    return (
        f"| {family} | {clip} | {len(decoded.indices)} of {decoded.total_frames} "
        f"| {shape.tolist()} | {ms['decode']:.0f} | {ms['u8']:.0f} | {ms['f32']:.0f} "
        f"| {ms['vllm']:.0f} ({path}) | {ms['vllm'] / ms[path]:.2f}x "
        f"| {ms['vllm'] / ms['decode']:.2f}x |"
    )


if __name__ == "__main__":
    main()
