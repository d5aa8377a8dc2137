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

from gateway.chat_template import load_chat_template, render
from multimodal.errors import MediaError
from multimodal.media import MediaPolicy, load_images
from multimodal.pipeline import PixelEncoding, Prepared, prepare
from multimodal.registry import processor_for

DESCRIPTION = """\
Preprocess images exactly as the gateway does: load (path, file://, http(s) or data URI),
decode, resize/normalize with the model's processor, render the chat template with one image
placeholder per image, expand the placeholders. Prints tensor names, shapes and dtypes, the
expanded token ids, placeholder ranges, hashes and field layouts (--json for all of it as JSON),
optionally saves the tensors (--out FILE.npz) and compares with transformers' processor
(--compare-hf).
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


def _prompt_ids(model: Path, count: int, text: str) -> tuple[str, list[int]]:
    from tokenizers import Tokenizer

    config = json.loads((model / "tokenizer_config.json").read_text())
    specials = {k: v for k, v in config.items() if k.endswith("_token") and isinstance(v, str)}
    content = [{"type": "image"}] * count + [{"type": "text", "text": text}]
    prompt = render(load_chat_template(model), [{"role": "user", "content": content}], **specials)
    tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
    return prompt, tokenizer.encode(prompt, add_special_tokens=False).ids


def run(args: argparse.Namespace) -> dict[str, Any]:
    processor = processor_for(args.model)
    images = asyncio.run(load_images([_source(i) for i in args.image], _policy(args)))
    prompt, ids = _prompt_ids(args.model, len(images), args.text)
    encoding = PixelEncoding(raw=args.pixels == "uint8", float_dtype=args.pixels)
    prepared = prepare(processor, ids, images, args.mm_processor_kwargs, encoding)
    report = summary(processor.family, prepared)
    if args.out:
        np.savez(
            args.out,
            prompt_ids=np.asarray(prepared.prompt_ids),
            ranges=np.asarray(prepared.ranges),
            **prepared.processed.tensors,
        )
    if args.compare_hf:
        report["compare_hf"] = compare_hf(args, prompt, images, prepared)
    return report


def summary(family: str, prepared: Prepared) -> dict[str, Any]:
    p = prepared.processed
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
        "wire_dtype": prepared.mm_inputs.pixel_values.dtype,
        "prompt_ids": prepared.prompt_ids,
        "placeholders": [{"offset": o, "length": n} for o, n in prepared.ranges],
        "hashes": prepared.hashes,
        "batched_keys": list(p.batched_keys),
        "flat_keys": dict(p.flat_keys),
        "keep_on_cpu_keys": list(p.keep_on_cpu_keys),
        "im_token_id": p.embed_token_id,
    }


def compare_hf(args, prompt: str, images, prepared: Prepared) -> dict[str, Any]:
    from transformers import AutoProcessor

    hf = AutoProcessor.from_pretrained(args.model)
    extra = {"do_rescale": False, "do_normalize": False} if args.pixels == "uint8" else {}
    out = hf(
        text=[prompt],
        images=[i.image for i in images],
        return_tensors="np",
        **extra,
        **args.mm_processor_kwargs,
    )
    result: dict[str, Any] = {
        "prompt_ids_equal": [int(i) for i in out["input_ids"][0]] == prepared.prompt_ids
    }
    for key, ours in prepared.processed.tensors.items():
        if key not in out:
            result[key] = "not produced by transformers (a sizes tensor for the wire)"
            continue
        theirs = np.asarray(out[key])
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
    args = build_parser().parse_args(argv)
    try:
        report = run(args)
    except (MediaError, ValueError, LookupError) as error:
        print(f"mmgate preprocess: {error}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report))
    else:
        print_human(report)
    return 0
