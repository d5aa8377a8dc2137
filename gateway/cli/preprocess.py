"""`mmgate preprocess`: run the gateway's image, video and audio preprocessing on one request and
show the result."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gateway.api.preprocess import audio_facts, referred_facts
from gateway.api.protocol import ChatPromptFields
from gateway.render.model_files import ModelFiles, is_model_dir
from gateway.render.prompt import Prompt, PromptBuilder
from gateway.render.renderer import ChatRenderer
from gateway.render.templates import read_chat_template_arg
from gateway.render.worker_media import MM_PROCESSING, fallback_placeholders, mm_processing_mode
from multimodal.audio_decode import DecodedAudio
from multimodal.errors import MmgateError
from multimodal.media import LoadedImage, MediaPolicy
from multimodal.pipeline import AudioItem, PixelEncoding, PreparedItems
from multimodal.processors.whisper_audio import AudioProcessor
from multimodal.registry import ModelProcessors, processors_for
from multimodal.video import LoadedVideo
from multimodal.video_decode import DecodedClip

DESCRIPTION = """\
Preprocess one chat turn exactly as the gateway does, with the gateway's own code: the images,
then the videos, then the audio clips (path, file://, http(s) or data URI), then --text as one
user message, rendered
with the model's chat template, tokenized, the images decoded and the videos' frames picked and
decoded as vLLM's loader for the model does, resized/normalized by the model's processors, their
placeholders expanded. Prints tensor names, shapes and dtypes, the expanded token ids,
placeholder ranges, hashes, field layouts and each video's picked frames (--json for all of it
as JSON), optionally saves the tensors (--out FILE.npz) and compares with transformers'
processor (--compare-hf). --mm-processing picks the path as `mmgate serve`'s flag does: media
the gateway has no processor for with this model (auto), or all media (worker), go to the
engine workers as `mmgate serve` sends them: checked, each clip decoded once, the placeholders
left for the worker to expand; shown with what the gateway knows of them (an audio clip's
container, sample rate, channels and length).
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mmgate preprocess", description=DESCRIPTION)
    p.add_argument("--model", required=True, type=Path, help="model directory")
    p.add_argument("--image", action="append", default=[], help="path or URL; repeatable")
    p.add_argument("--video", action="append", default=[], help="path or URL; repeatable")
    p.add_argument(
        "--audio", action="append", default=[], help="path or URL (WAV, FLAC, MP3, Ogg); repeatable"
    )
    p.add_argument("--text", default="Describe this.", help="user text after the media")
    p.add_argument(
        "--pixels",
        default="uint8",
        choices=("uint8", "float32", "float16", "bfloat16"),
        help="uint8 for engines that normalize on device (vLLM's default), else float dtype",
    )
    p.add_argument(
        "--mm-processing",
        choices=MM_PROCESSING,
        default="auto",
        help="who preprocesses media, as for `mmgate serve`: auto (the gateway where it has the "
        "model's processor, else the worker), gateway (SMG: router) or worker; the gateway "
        "checks the media either way (default: %(default)s)",
    )
    p.add_argument("--mm-processor-kwargs", type=json.loads, default={}, help="JSON object")
    p.add_argument("--chat-template", help="a chat template file or string overriding the model's")
    p.add_argument("--allowed-media-domains", nargs="*", default=None, help="URL host allow-list")
    p.add_argument("--allow-private-networks", action="store_true", help="allow e.g. localhost")
    p.add_argument("--out", type=Path, help="write tensors, ids and ranges to this .npz")
    p.add_argument("--json", action="store_true", help="print everything as JSON")
    p.add_argument("--compare-hf", action="store_true", help="diff against transformers")
    return p


def _source(value: str) -> str:
    if "://" in value or value.startswith("data:"):
        return value
    return Path(value).resolve().as_uri()


def _policy(args: argparse.Namespace) -> MediaPolicy:
    # Local paths given on the command line are the operator's own: allow their folder.
    paths = [*args.image, *args.video, *args.audio]
    local = [str(Path(i).resolve().parent) for i in paths if _source(i).startswith("file:")]
    return MediaPolicy(
        allowed_domains=tuple(args.allowed_media_domains) if args.allowed_media_domains else None,
        allowed_networks=("0.0.0.0/0", "::/0") if args.allow_private_networks else (),
        local_root=Path(os.path.commonpath(local)) if local else None,
    )


def _request(args: argparse.Namespace) -> ChatPromptFields:
    images = [{"type": "image_url", "image_url": {"url": _source(i)}} for i in args.image]
    videos = [{"type": "video_url", "video_url": {"url": _source(v)}} for v in args.video]
    clips = [{"type": "audio_url", "audio_url": {"url": _source(a)}} for a in args.audio]
    content = [*images, *videos, *clips, {"type": "text", "text": args.text}]
    return ChatPromptFields(
        messages=[{"role": "user", "content": content}],
        mm_processor_kwargs=args.mm_processor_kwargs,
    )


def _builder(args: argparse.Namespace) -> PromptBuilder:
    files = ModelFiles.load(args.model)
    processors = processors_for(files)
    template = read_chat_template_arg(args.chat_template) if args.chat_template else None
    # As `mmgate serve` renders media it has no processor for: as vLLM does, for the worker.
    architectures = files.config.get("architectures") or ()
    placeholders = {**fallback_placeholders(architectures), **processors.placeholders}
    renderer = ChatRenderer(files, placeholders, chat_template=template)
    mode = mm_processing_mode(args.mm_processing)
    return PromptBuilder(renderer, processors, _policy(args), mm_processing=mode)


def run(args: argparse.Namespace) -> dict[str, Any]:
    builder = _builder(args)
    request = _request(args)
    rendered = builder.render(request)
    if builder.by_worker(rendered):
        return _referred_report(asyncio.run(builder.refer(request, rendered)), builder, args)
    encoding = PixelEncoding(raw=args.pixels == "uint8", float_dtype=args.pixels)
    prompt = asyncio.run(builder.expand(request, encoding, rendered, keep_items=True))
    report = summary(prompt, builder.processors)
    if args.out:
        tensors = {
            f"{part.modality}_{name}" if len(prompt.prepared.parts) > 1 else name: value
            for part in prompt.prepared.parts
            for name, value in part.processed.tensors.items()
        }
        ranges = [r for part in prompt.prepared.parts for r in part.ranges]
        np.savez(args.out, prompt_ids=np.asarray(prompt.ids), ranges=np.asarray(ranges), **tensors)
    if args.compare_hf:
        report["compare_hf"] = compare_hf(args, prompt, builder.processors)
    return report


def summary(prompt: Prompt, processors: ModelProcessors) -> dict[str, Any]:
    """The request's prompt ids and, per modality, what its processor made ("parts"); the
    first part's facts also at the top level, each video's picked frames and each audio clip's
    facts."""
    messages = prompt.prepared.mm_inputs
    parts = [
        _part(part, mm, processors.get(part.modality).family)
        for part, mm in zip(prompt.prepared.parts, messages)
    ]
    audio = [
        _clip(item.data, audio_facts(item.data, item.pixels))
        for item in prompt.items
        if isinstance(item, AudioItem)
    ]
    return {
        **parts[0],
        "processed_by": "gateway",
        "prompt_ids": prompt.ids,
        "parts": parts,
        "videos": _videos(prompt),
        "audio": audio,
    }


def _referred_report(prompt: Prompt, builder: PromptBuilder, args: argparse.Namespace) -> dict:
    """What the gateway sends a worker that preprocesses: the prompt with one unexpanded
    placeholder per item, and what it knows of each item (their bytes, and an audio clip's
    facts as decoded)."""
    facts = referred_facts(prompt.media_refs.items, builder.media_policy)
    missing = sorted({m for m in facts if facts[m] and m not in builder.processors.by_modality})
    if args.out:
        np.savez(args.out, prompt_ids=np.asarray(prompt.ids))
    if builder.mm_processing == "worker":
        why = "--mm-processing worker"
    elif missing:
        why = f"no {' or '.join(missing)} processor in the gateway for this model"
    else:
        why = "the model's media go to the worker together"
    return {
        "processed_by": "worker",
        "why": why,
        "prompt_ids": prompt.ids,
        "parts": [],
        "videos": [],
        "images": [f.model_dump(include={"bytes", "mime"}) for f in facts["image"]],
        "referred_videos": [f.model_dump(include={"bytes", "mime"}) for f in facts["video"]],
        "audio": [_clip(None, f.model_dump()) for f in facts["audio"]],
        **(
            {"compare_hf": "nothing to compare: the worker makes the tensors"}
            if args.compare_hf
            else {}
        ),
    }


def _clip(data: bytes | None, facts: Mapping[str, Any]) -> dict[str, Any]:
    keys = ("format", "sample_rate", "channels", "seconds", "bytes")
    clip = {k: facts[k] for k in keys if k in facts}
    if data is not None:
        clip["bytes"] = len(data)
    return clip


def _part(part: PreparedItems, mm: Any, family: str) -> dict[str, Any]:
    p = part.processed
    return {
        "modality": part.modality,
        "processor": family,
        "tensors": {
            k: {
                "shape": list(v.shape),
                "dtype": str(v.dtype),
                "min": float(v.min()),
                "max": float(v.max()),
            }
            for k, v in p.tensors.items()
        },
        "wire_dtype": mm.pixel_values.dtype,
        "placeholders": [{"offset": o, "length": n} for o, n in part.ranges],
        "hashes": part.hashes,
        "batched_keys": list(p.batched_keys),
        "flat_keys": dict(p.flat_keys),
        "keep_on_cpu_keys": list(p.keep_on_cpu_keys),
        "im_token_id": p.embed_token_id,
    }


def _videos(prompt: Prompt) -> list[dict[str, Any]]:
    """Each video's frames as its loader picked them."""
    return [
        {
            "frames": list(item.clip.indices),
            "total_frames": item.clip.total_frames,
            "fps": float(item.clip.fps),
            "size": [int(item.clip.frames.shape[2]), int(item.clip.frames.shape[1])],
        }
        for item in prompt.items
        if isinstance(item, LoadedVideo)
    ]


def compare_hf(
    args: argparse.Namespace, prompt: Prompt, processors: ModelProcessors
) -> dict[str, Any]:
    """Each of our tensors against transformers' of the same name, or of the name the image
    processor's `hf_names` gives for it (tensors vLLM renames, e.g. Gemma 4's positions), or as
    vLLM lays out transformers' (Qwen2.5-Omni's audio features)."""
    from transformers import AutoProcessor

    hf_names = getattr(processors.by_modality.get("image"), "hf_names", None)

    hf = AutoProcessor.from_pretrained(args.model)
    extra = {"do_rescale": False, "do_normalize": False} if args.pixels == "uint8" else {}
    media: dict[str, Any] = {}
    if images := [i.image for i in prompt.items if isinstance(i, LoadedImage)]:
        media["images"] = images
    if clips := [i.clip for i in prompt.items if isinstance(i, LoadedVideo)]:
        # the frames as decoded, with the loader's metadata (timestamps come from it):
        # transformers samples none of its own (vLLM's loader did)
        media.update(
            videos=[_frames(c) for c in clips],
            video_metadata=[_metadata(c) for c in clips],
            do_sample_frames=False,
        )
    if clips := [i.pixels for i in prompt.items if isinstance(i, AudioItem)]:
        audio = processors.get("audio")
        assert isinstance(audio, AudioProcessor)  # the only audio processors there are
        media.update(_hf_audio_inputs(audio, clips))
    out = hf(
        text=[prompt.text],
        return_tensors="pt",  # "np" cannot hold Llama 4's bfloat16 pixels
        **media,
        **extra,
        **args.mm_processor_kwargs,
    )
    result: dict[str, Any] = {
        "prompt_ids_equal": [int(i) for i in out["input_ids"][0]] == prompt.ids
    }
    for part in prompt.prepared.parts:
        names = dict(hf_names or {}) if part.modality == "image" else {}
        if part.modality == "video":
            names["pixel_values"] = "pixel_values_videos"
        theirs = {**out, **_vllm_audio_layout(out)} if part.modality == "audio" else out
        into = result if part.modality == "image" else result.setdefault(part.modality, {})
        _compare(part, theirs, names, into)
    return result


def _hf_audio_inputs(processor: AudioProcessor, clips: Sequence[DecodedAudio]) -> dict[str, Any]:
    """The HF processor's audio arguments as vLLM's chat path makes them: each clip as decoded
    (vLLM's loader: channels averaged), resampled by torchaudio's `Resample` at its defaults
    to the feature extractor's rate (vLLM's `resample_audio_torchaudio`, oneDNN off as there),
    with the rate and, for Qwen2-Audio, `truncation=True` (its vLLM processor's kwargs)."""
    import torch
    import torchaudio

    rate = processor.settings.sampling_rate
    samples = []
    for clip in clips:
        mono = clip.mono()
        if clip.sample_rate != rate:
            # (torch warns of TF32 on Intel GPUs whenever the flags are set)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                with torch.backends.mkldnn.flags(enabled=False):
                    resampler = torchaudio.transforms.Resample(clip.sample_rate, rate)
                    mono = resampler(torch.as_tensor(mono, dtype=torch.float32)).numpy()
        samples.append(mono)
    kwargs: dict[str, Any] = {"audio": samples, "sampling_rate": rate}
    if processor.truncate:
        kwargs["truncation"] = True
    return kwargs


def _vllm_audio_layout(out: Any) -> dict[str, Any]:
    """Qwen2.5-Omni's audio tensors as vLLM's processor makes them of the HF processor's
    (`_postprocess_hf_mm_data`): each clip's real frames, frame-major and concatenated (the
    gateway's `input_audio_features` layout on the wire), and their counts."""
    features, mask = out.get("input_features"), out.get("feature_attention_mask")
    if features is None or mask is None:
        return {}
    return {
        "input_audio_features": features.permute(0, 2, 1)[mask.bool()],
        "audio_feature_lengths": mask.sum(-1),
    }


def _frames(clip: DecodedClip) -> Any:
    import torch

    return torch.from_numpy(clip.frames).permute(0, 3, 1, 2)


def _metadata(clip: DecodedClip) -> dict[str, Any]:
    """What vLLM's loader reports of a clip (VideoMetadata's fields)."""
    return {
        "total_num_frames": clip.total_frames,
        "fps": clip.fps,
        "duration": clip.total_frames / clip.fps if clip.fps else 0.0,
        "frames_indices": list(clip.indices),
    }


def _compare(part: PreparedItems, out: Any, names: Mapping[str, str], into: dict) -> None:
    result = into
    for key, ours in part.processed.tensors.items():
        hf_key = names.get(key, key)
        if hf_key not in out:
            result[key] = "not produced by transformers (a sizes tensor for the wire)"
            continue
        theirs = out[hf_key]
        if str(theirs.dtype) == "torch.bfloat16":
            theirs = theirs.float()  # exact
        theirs = np.asarray(theirs)
        if theirs.shape == (1, *ours.shape):
            # the one prompt's batch dimension, which vLLM squeezes (Idefics3's tiles)
            theirs = theirs[0]
        if theirs.shape != ours.shape:
            result[key] = (
                f"shape differs: ours {list(ours.shape)}, transformers {list(theirs.shape)}"
            )
            continue
        diff = np.abs(ours.astype(np.float64) - theirs.astype(np.float64))
        result[key] = {"max_abs_diff": float(diff.max()), "dtype_equal": ours.dtype == theirs.dtype}


def print_human(report: dict[str, Any]) -> None:
    print(f"prompt ids:    {len(report['prompt_ids'])} tokens")
    if report["processed_by"] == "worker":
        print(f"media:         preprocessed by the engine worker ({report['why']});")
        print("               the prompt holds one placeholder per item, for the worker to expand")
        for i, image in enumerate(report["images"]):
            print(f"  {f'image {i}':13}{image['mime']}  {image['bytes']} bytes")
        for i, video in enumerate(report["referred_videos"]):
            print(f"  {f'video {i}':13}{video['mime']}  {video['bytes']} bytes")
        for i, clip in enumerate(report["audio"]):
            print(f"  {f'audio {i}':13}{_clip_line(clip)}")
    videos, clips = iter(report["videos"]), iter(report["audio"])
    for part in report["parts"]:
        _print_part(part, videos, clips)
    if "compare_hf" in report:
        print(f"transformers:  {json.dumps(report['compare_hf'])}")


def _clip_line(clip: Mapping[str, Any]) -> str:
    return (
        f"{clip['format']}  {clip['sample_rate']} Hz  {clip['channels']} channel(s)"
        f"  {clip['seconds']:g} s  {clip['bytes']} bytes"
    )


def _print_part(
    part: dict[str, Any], videos: Iterator[dict[str, Any]], clips: Iterator[dict[str, Any]]
) -> None:
    modality = part["modality"]
    heading = "audio:" if modality == "audio" else f"{modality}s:"
    print(f"{heading:15}processor {part['processor']}  (wire dtype {part['wire_dtype']})")
    for name, t in part["tensors"].items():
        values = f"[{t['min']:g}, {t['max']:g}]"
        print(f"  tensor       {name:18} {t['dtype']:8} {t['shape']}  {values}")
    for i, (ph, h) in enumerate(zip(part["placeholders"], part["hashes"])):
        where = f"placeholder offset {ph['offset']} length {ph['length']}"
        print(f"  {f'{modality} {i}':13}{where}  hash {h}")
        if modality == "video":
            v = next(videos)
            clip = f"of {v['total_frames']} at {v['fps']:g} fps, {v['size'][0]}x{v['size'][1]}"
            print(f"    frames     {v['frames']} {clip}")
        elif modality == "audio":
            print(f"    decoded    {_clip_line(next(clips))}")
    print(
        f"  layout       batched {part['batched_keys']}  flat {part['flat_keys']}"
        f"  keep_on_cpu {part['keep_on_cpu_keys']}  im_token_id {part['im_token_id']}"
    )


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not is_model_dir(args.model):
        parser.error(f"{args.model} is not a model directory (it has no tokenizer.json)")
    if not args.image and not args.video and not args.audio:
        parser.error("give at least one --image, --video or --audio")
    try:
        report = run(args)
    except (MmgateError, ValueError) as error:
        print(f"mmgate preprocess: {error}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report))
    else:
        print_human(report)
    return 0
