"""`mmgate preprocess`: run the gateway's image preprocessing on one request and show the result."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from gateway.api.protocol import ChatPromptFields
from gateway.render.model_files import ModelFiles, is_model_dir
from gateway.render.prompt import Prompt, PromptBuilder
from gateway.render.renderer import ChatRenderer
from gateway.render.templates import read_chat_template_arg
from multimodal.errors import MmgateError
from multimodal.media import MediaPolicy
from multimodal.pipeline import PixelEncoding
from multimodal.registry import processors_for

DESCRIPTION = """\
Preprocess one chat turn exactly as the gateway does, with the gateway's own code: the images
(path, file://, http(s) or data URI) then --text as one user message, rendered with the model's
chat template, tokenized, the images decoded and resized/normalized by the model's processor,
their placeholders expanded. Prints tensor names, shapes and dtypes, the expanded token ids,
placeholder ranges, hashes and field layouts (--json for all of it as JSON), optionally saves
the tensors (--out FILE.npz) and compares with transformers' processor (--compare-hf).
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mmgate preprocess", description=DESCRIPTION)
    p.add_argument("--model", required=True, type=Path, help="model directory")
    p.add_argument("--image", action="append", required=True, help="path or URL; repeatable")
    p.add_argument("--text", default="Describe the image.", help="user text after the images")
    p.add_argument(
        "--pixels",
        default="uint8",
        choices=("uint8", "float32", "float16", "bfloat16"),
        help="uint8 for engines that normalize on device (vLLM's default), else float dtype",
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
    local = [str(Path(i).resolve().parent) for i in args.image if _source(i).startswith("file:")]
    return MediaPolicy(
        allowed_domains=tuple(args.allowed_media_domains) if args.allowed_media_domains else None,
        allowed_networks=("0.0.0.0/0", "::/0") if args.allow_private_networks else (),
        local_root=Path(os.path.commonpath(local)) if local else None,
    )


def _request(args: argparse.Namespace) -> ChatPromptFields:
    images = [{"type": "image_url", "image_url": {"url": _source(i)}} for i in args.image]
    content = [*images, {"type": "text", "text": args.text}]
    return ChatPromptFields(
        messages=[{"role": "user", "content": content}],
        mm_processor_kwargs=args.mm_processor_kwargs,
    )


def _builder(args: argparse.Namespace) -> PromptBuilder:
    files = ModelFiles.load(args.model)
    processors = processors_for(files)
    template = read_chat_template_arg(args.chat_template) if args.chat_template else None
    renderer = ChatRenderer(files, processors.placeholders, chat_template=template)
    return PromptBuilder(renderer, processors, _policy(args))


def run(args: argparse.Namespace) -> dict[str, Any]:
    builder = _builder(args)
    processor = builder.processors.get("image")
    encoding = PixelEncoding(raw=args.pixels == "uint8", float_dtype=args.pixels)
    prompt = asyncio.run(builder.build(_request(args), encoding, keep_items=True))
    report = summary(processor.family, prompt)
    (images,) = prompt.prepared.parts
    if args.out:
        np.savez(
            args.out,
            prompt_ids=np.asarray(prompt.ids),
            ranges=np.asarray(images.ranges),
            **images.processed.tensors,
        )
    if args.compare_hf:
        report["compare_hf"] = compare_hf(args, prompt)
    return report


def summary(family: str, prompt: Prompt) -> dict[str, Any]:
    (images,) = prompt.prepared.parts
    p = images.processed
    return {
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
        "wire_dtype": prompt.prepared.mm_inputs[0].pixel_values.dtype,
        "prompt_ids": prompt.ids,
        "placeholders": [{"offset": o, "length": n} for o, n in images.ranges],
        "hashes": images.hashes,
        "batched_keys": list(p.batched_keys),
        "flat_keys": dict(p.flat_keys),
        "keep_on_cpu_keys": list(p.keep_on_cpu_keys),
        "im_token_id": p.embed_token_id,
    }


# Tensors vLLM's own processors name otherwise than transformers' (ours -> transformers').
HF_NAMES = {"grid_thws": "image_grid_thw"}  # Kimi-K2.5


def compare_hf(args: argparse.Namespace, prompt: Prompt) -> dict[str, Any]:
    from transformers import AutoProcessor

    hf = AutoProcessor.from_pretrained(args.model)
    extra = {"do_rescale": False, "do_normalize": False} if args.pixels == "uint8" else {}
    out = hf(
        text=[prompt.text],
        images=[i.image for i in prompt.items],
        return_tensors="pt",  # "np" cannot hold Llama 4's bfloat16 pixels
        **extra,
        **args.mm_processor_kwargs,
    )
    result: dict[str, Any] = {
        "prompt_ids_equal": [int(i) for i in out["input_ids"][0]] == prompt.ids
    }
    (images,) = prompt.prepared.parts
    for key, ours in images.processed.tensors.items():
        if HF_NAMES.get(key, key) not in out:
            result[key] = "not produced by transformers (a sizes tensor for the wire)"
            continue
        theirs = out[HF_NAMES.get(key, key)]
        if str(theirs.dtype) == "torch.bfloat16":
            theirs = theirs.float()  # exact
        theirs = np.asarray(theirs)
        if theirs.shape != ours.shape:
            result[key] = (
                f"shape differs: ours {list(ours.shape)}, transformers {list(theirs.shape)}"
            )
            continue
        diff = np.abs(ours.astype(np.float64) - theirs.astype(np.float64))
        result[key] = {"max_abs_diff": float(diff.max()), "dtype_equal": ours.dtype == theirs.dtype}
    return result


def print_human(report: dict[str, Any]) -> None:
    print(f"processor:     {report['processor']}  (wire pixel dtype {report['wire_dtype']})")
    for name, t in report["tensors"].items():
        print(f"tensor:        {name:18} {t['dtype']:8} {t['shape']}  [{t['min']:g}, {t['max']:g}]")
    print(f"prompt ids:    {len(report['prompt_ids'])} tokens")
    for i, (ph, h) in enumerate(zip(report["placeholders"], report["hashes"])):
        print(f"image {i}:       placeholder offset {ph['offset']} length {ph['length']}  hash {h}")
    print(
        f"layout:        batched {report['batched_keys']}  flat {report['flat_keys']}"
        f"  keep_on_cpu {report['keep_on_cpu_keys']}  im_token_id {report['im_token_id']}"
    )
    if "compare_hf" in report:
        print(f"transformers:  {json.dumps(report['compare_hf'])}")


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not is_model_dir(args.model):
        parser.error(f"{args.model} is not a model directory (it has no tokenizer.json)")
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
