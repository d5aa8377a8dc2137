"""Time image preprocessing (decode + processor) against transformers' image processors.

    python -m benchmarks.preprocess_bench [--quick] [--repeats N] [--family NAME] [--json FILE]
        [--csv FILE]

For Qwen2.5-VL, Qwen2-VL, Qwen3-VL, Qwen3.5, LLaVA-1.5, LLaVA-NeXT, Gemma 3, Pixtral-12B,
InternVL3 and Llama 4 (model dirs written to a temp dir: configs, tokenizer, preprocessor
config, no weights; with their released preprocessor configs, real pixel limits included)
and a synthetic photo-like image per size, encoded once as JPEG (quality 90) and PNG, it times:

* decode: ``multimodal.decode.decode_pixels(bytes)``, the gateway's decode: vLLM's pixels,
  JPEGs decoded by libjpeg-turbo straight into a numpy array (``--no-fast-jpeg``: Pillow's path
  for every format, as ``decode_image``);
* ours u8 / ours f32: decode + ``processor.process(..., raw_pixels=True / False)`` on its
  pixels as the pipeline hands them over (``LoadedImage.pixels``);
* HF u8 / HF f32: vLLM's ``ImageMediaIO().load_bytes(bytes)`` (our decode if vLLM is not
  installed) + ``AutoImageProcessor.from_pretrained(dir)(images=[img], return_tensors="np")``,
  with ``do_rescale=False, do_normalize=False`` for u8 (what vLLM calls when the engine
  normalizes on device); for Kimi-K2.5, vLLM's own KimiK25FusedVisionProcessor instead (what
  vLLM runs for that model: transformers' processor is not on its path);
* the same processor calls again from an already decoded image ("processor only").

The variants of one case run interleaved (one call of each per round, the order rotated every
round) so load from anything else on the machine hits them alike; the table shows the median
of the rounds.  Everything is single-threaded (BLAS/OpenMP env vars forced to 1 before numpy is
imported, torch.set_num_threads(1)), except the concurrency table, which runs our pipeline on
1280x960 JPEG in 1 vs 2 worker threads and in 2 worker processes (best and median batch, next
to a pure-Python yardstick).  Before timing, our outputs are checked against transformers' (u8
bit-identical, f32 within 1e-5).
"""

from __future__ import annotations

import os

# Must precede the numpy/torch imports: OpenBLAS, OpenMP and numba (vLLM's Kimi-K2.5
# processor) read them once, when loaded.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import concurrent.futures as futures  # noqa: E402
import csv  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import multiprocessing  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from PIL import Image, ImageDraw  # noqa: E402

from gateway.render.model_files import ModelFiles  # noqa: E402
from multimodal import decode, native  # noqa: E402
from multimodal.decode import decode_image, decode_pixels  # noqa: E402
from multimodal.policy import MediaPolicy  # noqa: E402
from multimodal.registry import processor_for  # noqa: E402

SIZES = ((224, 224), (640, 480), (1280, 960), (1920, 1080), (3840, 2160))  # width x height
QUICK_SIZES = ((224, 224), (1280, 960))
FORMATS = ("JPEG", "PNG")
PIPELINES = ("decode", "ours_u8", "ours_f32", "hf_u8", "hf_f32")  # encoded bytes in
PROCESSORS = ("ours_proc_u8", "ours_proc_f32", "hf_proc_u8", "hf_proc_f32")  # decoded image in
VARIANTS = PIPELINES + PROCESSORS
CONCURRENCY_SIZE = (1280, 960)
POLICY = MediaPolicy()

# The real Qwen2.5-VL-*-Instruct preprocessor_config.json (transformers' Qwen2VLImageProcessor).
QWEN25_PREPROCESSOR = {
    "min_pixels": 3136,
    "max_pixels": 12845056,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "image_processor_type": "Qwen2VLImageProcessor",
    "processor_class": "Qwen2_5_VLProcessor",
}


# --- model dirs --------------------------------------------------------------------------------


def build_qwen25(out_dir: Path) -> Path:
    """A Qwen2.5-VL dir: the tiny Qwen2-VL's tokenizer, a qwen2_5_vl config, real pixel limits."""
    from transformers import Qwen2_5_VLConfig

    from engine_server.tiny_models import ensure_model

    src = ensure_model("vision")
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "special_tokens_map.json", "chat_template.jinja"):
        shutil.copy(src / name, out_dir / name)
    tokenizer_config = json.loads((src / "tokenizer_config.json").read_text())
    tokenizer_config["processor_class"] = "Qwen2_5_VLProcessor"
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    tiny = json.loads((src / "config.json").read_text())
    vision = {
        "depth": 2,
        "hidden_size": 64,
        "num_heads": 2,
        "intermediate_size": 128,
        "out_hidden_size": tiny["text_config"]["hidden_size"],
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "window_size": 112,
        "fullatt_block_indexes": [1],
    }
    ids = {k: tiny[k] for k in tiny if k.endswith("_token_id")}
    Qwen2_5_VLConfig(text_config=tiny["text_config"], vision_config=vision, **ids).save_pretrained(
        out_dir
    )
    (out_dir / "preprocessor_config.json").write_text(json.dumps(QWEN25_PREPROCESSOR, indent=2))
    return out_dir


# The real Qwen2-VL-*-Instruct and Qwen3-VL-*-Instruct preprocessor_config.json files.
QWEN2_PREPROCESSOR = {**QWEN25_PREPROCESSOR, "processor_class": "Qwen2VLProcessor"}
QWEN3_PREPROCESSOR = {
    "size": {"longest_edge": 16777216, "shortest_edge": 65536},
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "processor_class": "Qwen3VLProcessor",
    "image_processor_type": "Qwen2VLImageProcessorFast",
}


def build_qwen_variant(model_type: str, preprocessor: dict) -> Callable[[Path], Path]:
    """The Qwen2.5-VL dir with another model_type and that model's image processor config:
    all the processors read (the vision tower's weights are never loaded)."""

    def build(out_dir: Path) -> Path:
        build_qwen25(out_dir)
        config = json.loads((out_dir / "config.json").read_text())
        config["model_type"] = model_type
        (out_dir / "config.json").write_text(json.dumps(config, indent=2))
        (out_dir / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2))
        return out_dir

    return build


def build_llava(kind: str) -> Callable[[Path], Path]:
    def build(out_dir: Path) -> Path:
        # The parity tests' builder: llava-hf's CLIP-336 processor configs.
        from tests.support.llava_models import build_model

        out_dir.mkdir(parents=True, exist_ok=True)
        return build_model(out_dir, kind)

    return build


def build_pixtral(out_dir: Path) -> Path:
    # The parity tests' weightless Pixtral-12B (HF format). Its image processor alone resizes as
    # PixtralProcessor does (16px tokens); Mistral 3's alone would not (14px, not 2x2-merged 28).
    from tests.support.pixtral_models import build_model

    return build_model(out_dir, weights=False, kind="pixtral")


def build_gemma3(out_dir: Path) -> Path:
    # The parity tests' weightless Gemma 3: the released 896x896 preprocessor config.
    from tests.support.gemma3_models import build_model

    return build_model(out_dir, weights=False)


def build_internvl(out_dir: Path) -> Path:
    # The parity tests' weightless InternVL3 (HF format), released 448px tiles, 1..12 plus a
    # thumbnail. Its image processor alone tiles only when its config says so; InternVLProcessor
    # (what vLLM calls) always passes crop_to_patches=True, so the config says so here.
    from tests.support.internvl_models import build_model

    return build_model(out_dir, weights=False, crop_to_patches=True)


def build_qwen35(out_dir: Path) -> Path:
    # The parity tests' weightless Qwen3.5 with the released preprocessor config.
    from tests.support.qwen35_models import build_model

    return build_model(out_dir, weights=False, tiny=False)


def build_llama4(out_dir: Path) -> Path:
    # The parity tests' weightless Llama 4: the released preprocessor config (336px tiles, up
    # to 16 plus a global tile).
    from tests.support.llama4_models import build_model

    return build_model(out_dir, weights=False)


def build_llava_onevision(out_dir: Path) -> Path:
    # The parity tests' weightless LLaVA-OneVision: the released ov-hf preprocessor config
    # (384px tiles, 36 pinpoints up to 2304px).
    from tests.support.llava_onevision_models import build_model

    return build_model(out_dir, weights=False)


def build_gemma4(out_dir: Path) -> Path:
    # The parity tests' weightless Gemma 4: the released image processor settings (280 soft
    # tokens, 16 px patches pooled 3x3).
    from tests.support.gemma4_models import build_model

    return build_model(out_dir, weights=False)


def build_glm4v(out_dir: Path) -> Path:
    # The parity tests' weightless GLM-4.1V: the released preprocessor config (112^2 to
    # 9,633,792 pixels, counted with the temporal copy).
    from tests.support.glm4v_models import build_model

    return build_model(out_dir, "glm4v", weights=False, tiny=False)


def build_idefics3(variant: str) -> Callable[[Path], Path]:
    # The parity tests' weightless Idefics3 / SmolVLM with the released preprocessor configs
    # (LANCZOS; 364px tiles, long edge 1456 / 512px tiles, long edge 2048).
    def build(out_dir: Path) -> Path:
        from tests.support.idefics3_models import VARIANTS, build_model

        return build_model(out_dir, weights=False, variant=VARIANTS[variant])

    return build


def build_kimi_k25(out_dir: Path) -> Path:
    # The parity tests' weightless Kimi-K2.5 with the released media_proc_cfg.
    from tests.support.kimi_k25_models import build_model

    return build_model(out_dir, weights=False, tiny=False)


def kimi_k25_reference(model_dir: Path):
    from tests.support.kimi_k25_models import VllmImageProcessor

    return VllmImageProcessor(model_dir)


# Families whose reference column is not transformers' image processor: vLLM runs its own.
REFERENCES = {"Kimi-K2.5": kimi_k25_reference}

FAMILIES = {
    "Qwen2.5-VL": build_qwen25,
    "Qwen2-VL": build_qwen_variant("qwen2_vl", QWEN2_PREPROCESSOR),
    "Qwen3-VL": build_qwen_variant("qwen3_vl", QWEN3_PREPROCESSOR),
    "Qwen3.5": build_qwen35,
    "LLaVA-1.5": build_llava("llava"),
    "LLaVA-NeXT": build_llava("llava_next"),
    "Gemma-3": build_gemma3,
    "Pixtral-12B": build_pixtral,
    "InternVL3": build_internvl,
    "Llama-4": build_llama4,
    "LLaVA-OneVision": build_llava_onevision,
    "Gemma-4": build_gemma4,
    "GLM-4.xV": build_glm4v,
    "Idefics3": build_idefics3("idefics3"),
    "SmolVLM": build_idefics3("smolvlm"),
    "Kimi-K2.5": build_kimi_k25,
}


# --- images ------------------------------------------------------------------------------------


def photo_like(width: int, height: int, seed: int = 0) -> Image.Image:
    """A deterministic synthetic "photo": smooth gradients, shapes with hard edges, noise."""
    rng = np.random.default_rng(seed)
    y = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None]
    x = np.linspace(0.0, 1.0, width, dtype=np.float32)[None, :]
    channels = []
    for c in range(3):  # a sky-to-ground gradient plus a few low-frequency waves per channel
        plane = 90 + 70 * y + 40 * c * x
        for _ in range(4):
            fx, fy = rng.uniform(0.5, 4.0, 2)
            phase = rng.uniform(0, 2 * np.pi)
            plane = plane + rng.uniform(10, 30) * np.sin(2 * np.pi * (fx * x + fy * y) + phase)
        channels.append(plane)
    image = Image.fromarray(np.clip(np.stack(channels, axis=-1), 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    scale = min(width, height)
    for _ in range(12):  # objects: ellipses, polygons and lines, positions relative to the size
        fill = tuple(int(v) for v in rng.integers(0, 256, 3))
        cx, cy = rng.uniform(0, width), rng.uniform(0, height)
        r = rng.uniform(0.05, 0.25) * scale
        shape = rng.integers(0, 3)
        if shape == 0:
            draw.ellipse((cx - r, cy - r * 0.7, cx + r, cy + r * 0.7), fill=fill)
        elif shape == 1:
            angles = np.sort(rng.uniform(0, 2 * np.pi, 5))
            points = [(cx + r * np.cos(a), cy + r * np.sin(a)) for a in angles]
            draw.polygon(points, fill=fill)
        else:
            end = (cx + rng.uniform(-2, 2) * r, cy + rng.uniform(-2, 2) * r)
            draw.line((cx, cy, *end), fill=fill, width=max(1, int(r / 10)))
    pixels = np.asarray(image, dtype=np.float32)
    pixels += rng.normal(0.0, 4.0, pixels.shape).astype(np.float32)  # sensor noise
    return Image.fromarray(np.clip(pixels + 0.5, 0, 255).astype(np.uint8))


def encode(image: Image.Image, fmt: str) -> bytes:
    buffer = io.BytesIO()
    if fmt == "JPEG":
        image.save(buffer, "JPEG", quality=90)
    else:
        image.save(buffer, "PNG")
    return buffer.getvalue()


# --- pipelines ---------------------------------------------------------------------------------


def vllm_loader() -> tuple[Callable[[bytes], Image.Image], str]:
    """The decode in front of transformers: vLLM's own, or ours (same pixels) without vLLM."""
    try:
        from vllm.multimodal.media import ImageMediaIO
    except ImportError:
        return (lambda data: decode_image(data, POLICY)), "multimodal.decode.decode_image"
    media_io = ImageMediaIO()
    return (lambda data: media_io.load_bytes(data).media), "vllm ImageMediaIO().load_bytes"


def our_decode(data: bytes) -> Image.Image | np.ndarray:
    """The gateway's decode (multimodal.media): an RGB array for JPEGs, else a PIL image."""
    return decode_pixels(data, POLICY)[0]


def ours(processor, image: Image.Image | np.ndarray, raw: bool) -> np.ndarray:
    # np.asarray as LoadedImage.pixels does it: a copy for PIL images, none for arrays.
    return processor.process([np.asarray(image)], processor.resolve({}), raw_pixels=raw).tensors[
        "pixel_values"
    ]


def theirs(image_processor, image: Image.Image, raw: bool) -> np.ndarray:
    extra = {"do_rescale": False, "do_normalize": False} if raw else {}
    if not raw and type(image_processor).__name__ in BFLOAT16_PROCESSORS:
        # bfloat16 pixels, which numpy cannot hold: torch's tensor, as float32 (exact)
        out = image_processor(images=[image], return_tensors="pt", **extra)["pixel_values"]
        return out.float().numpy()
    out = image_processor(images=[image], return_tensors="np", **extra)["pixel_values"]
    if type(image_processor).__name__ in BATCH_OF_ONE_PROCESSORS:
        out = out[0]  # a view: the batch dimension vLLM squeezes
    return out


# Image processors that normalize in bfloat16 (return_tensors="np" refuses their output).
BFLOAT16_PROCESSORS = ("Llama4ImageProcessor",)
# Image processors whose tiles keep the images' batch dimension, which vLLM squeezes
# (Idefics3's _postprocess_hf_mm_data), and which pad raw pixels into float32 (vLLM passes
# those on as floats; our raw tiles are uint8, compared by value).
BATCH_OF_ONE_PROCESSORS = ("Idefics3ImageProcessor", "SmolVLMImageProcessor")


def variants(processor, image_processor, load, data: bytes) -> dict[str, Callable[[], object]]:
    """Every timed variant for one encoded image, as calls without arguments."""
    ours_image = our_decode(data)  # the processor-only variants start decoded
    hf_image = load(data)
    fns = {
        "decode": lambda: our_decode(data),
        "ours_u8": lambda: ours(processor, our_decode(data), True),
        "ours_f32": lambda: ours(processor, our_decode(data), False),
        "hf_u8": lambda: theirs(image_processor, load(data), True),
        "hf_f32": lambda: theirs(image_processor, load(data), False),
        "ours_proc_u8": lambda: ours(processor, ours_image, True),
        "ours_proc_f32": lambda: ours(processor, ours_image, False),
        "hf_proc_u8": lambda: theirs(image_processor, hf_image, True),
        "hf_proc_f32": lambda: theirs(image_processor, hf_image, False),
    }
    assert tuple(fns) == VARIANTS
    return fns


def check_parity(results: dict[str, np.ndarray], raw_as_float: bool = False) -> str:
    """Our tensors vs transformers': u8 must be identical (transformers' may be float32 whole
    values with `raw_as_float`), f32 within 1e-5."""
    u8 = results["ours_u8"], results["hf_u8"]
    f32 = results["ours_f32"], results["hf_f32"]
    dtype = np.float32 if raw_as_float else u8[0].dtype
    same = u8[0].shape == u8[1].shape and u8[1].dtype == dtype and np.array_equal(*u8)
    close = f32[0].shape == f32[1].shape and f32[0].dtype == f32[1].dtype
    close = close and float(np.abs(f32[0] - f32[1]).max()) <= 1e-5
    return "yes" if same and close else "NO"


def interleaved(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """ms per call of each fn: `repeats` rounds, one call of each per round, order rotated."""
    names = list(fns)
    runs: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            start = time.perf_counter()
            fns[name]()
            runs[name].append((time.perf_counter() - start) * 1e3)
    return runs


def output_shape(pixel_values: np.ndarray) -> str:
    return "x".join(str(d) for d in pixel_values.shape)


def bench_family(
    name: str, model_dir: Path, encoded: dict, load, repeats: int
) -> list[dict[str, object]]:
    from transformers import AutoImageProcessor

    processor = processor_for(ModelFiles.load(model_dir))
    image_processor = REFERENCES.get(name, AutoImageProcessor.from_pretrained)(model_dir)
    rows = []
    for (width, height), fmt in encoded:
        data = encoded[(width, height), fmt]
        fns = variants(processor, image_processor, load, data)
        # Warm-up call of each (weight tables, allocator), which also gives the parity check.
        results = {v: fn() for v, fn in fns.items()}
        runs = interleaved(fns, repeats)
        rows.append(
            {
                "family": name,
                "size": f"{width}x{height}",
                "format": fmt,
                "bytes": len(data),
                "output": output_shape(results["ours_u8"]),
                "same": check_parity(
                    results, type(image_processor).__name__ in BATCH_OF_ONE_PROCESSORS
                ),
                "median_ms": {v: statistics.median(runs[v]) for v in VARIANTS},
                "min_ms": {v: min(runs[v]) for v in VARIANTS},
                "runs_ms": runs,
            }
        )
        print(f"  {name} {width}x{height} {fmt} done", file=sys.stderr, flush=True)
    return rows


# --- concurrency -------------------------------------------------------------------------------

_WORKER: dict[str, object] = {}


def _init_worker(model_dir: str, fast_jpeg: bool) -> None:
    _WORKER["processor"] = processor_for(ModelFiles.load(Path(model_dir)))
    decode.FAST_JPEG = fast_jpeg  # --no-fast-jpeg reaches the spawned processes too


SPIN_LOOPS = 200_000  # ~5-10 ms of pure-Python work


def _spin() -> int:
    total = 0
    for i in range(SPIN_LOOPS):
        total += i
    return total


def _worker_run(data: bytes, variant: str) -> tuple[int, ...]:
    # Returns only the shape: the processes' compute is measured, not shipping tensors back.
    if variant == "spin":  # holds the GIL throughout: the reference for "does not scale"
        return (_spin(),)
    image = our_decode(data)
    if variant == "decode":
        return np.shape(image)
    return ours(_WORKER["processor"], image, variant == "ours_u8").shape


def bench_concurrency(model_dir: Path, data: bytes, repeats: int, images: int) -> list[dict]:
    """Images/s of decode and our pipelines with 1 and 2 threads and 2 processes.

    A pure-Python loop runs the same way as a yardstick: it cannot scale on threads (GIL), and
    its 2-process speed-up shows how much of the second core was free during the run.
    """
    _init_worker(str(model_dir), decode.FAST_JPEG)
    threads1 = futures.ThreadPoolExecutor(1)
    threads2 = futures.ThreadPoolExecutor(2)
    # spawn: the parent has torch's and vLLM's threads running, which fork does not carry over.
    procs2 = futures.ProcessPoolExecutor(
        2,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_init_worker,
        initargs=(str(model_dir), decode.FAST_JPEG),
    )
    pools = {"1 thread": threads1, "2 threads": threads2, "2 processes": procs2}
    rows = []
    try:
        for variant in ("spin", "decode", "ours_u8", "ours_f32"):
            batch = [data] * images
            kinds = [variant] * images

            def run(pool, batch=batch, kinds=kinds):
                list(pool.map(_worker_run, batch, kinds))

            for pool in pools.values():  # warm up every worker (spawn, imports, weight tables)
                run(pool)
            runs = interleaved({k: (lambda p=p: run(p)) for k, p in pools.items()}, repeats)
            rows.append(
                {
                    "variant": variant,
                    "images": images,
                    # Best batch: load from elsewhere only ever slows a batch down.
                    "images_per_s": {k: images * 1e3 / min(v) for k, v in runs.items()},
                    "median_images_per_s": {
                        k: images * 1e3 / statistics.median(v) for k, v in runs.items()
                    },
                    "runs_ms": runs,
                }
            )
    finally:
        for pool in pools.values():
            pool.shutdown()
    return rows


# --- report ------------------------------------------------------------------------------------

LABELS = {
    "decode": "decode",
    "ours_u8": "ours u8",
    "ours_f32": "ours f32",
    "hf_u8": "HF u8",
    "hf_f32": "HF f32",
    "ours_proc_u8": "ours u8",
    "ours_proc_f32": "ours f32",
    "hf_proc_u8": "HF u8",
    "hf_proc_f32": "HF f32",
    "spin": "pure-Python loop (yardstick)",
}


def cell(ms: float) -> str:
    return f"{ms:.1f} ms ({1e3 / ms:.0f}/s)" if ms < 100 else f"{ms:.0f} ms ({1e3 / ms:.1f}/s)"


def markdown(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(cells) + " |" for cells in rows])


def family_table(rows: list[dict]) -> str:
    """End to end, encoded bytes in: ms and images/s, speed-ups, decode share."""
    head = ["size", "fmt", "output"] + [LABELS[v] for v in PIPELINES]
    head += ["HF/ours u8", "HF/ours f32", "decode share u8", "decode share f32", "same"]
    body = []
    for row in rows:
        m = row["median_ms"]
        cells = [row["size"], row["format"], row["output"]] + [cell(m[v]) for v in PIPELINES]
        cells += [f"{m['hf_u8'] / m['ours_u8']:.2f}x", f"{m['hf_f32'] / m['ours_f32']:.2f}x"]
        cells += [f"{m['decode'] / m['ours_u8']:.0%}", f"{m['decode'] / m['ours_f32']:.0%}"]
        body.append(cells + [row["same"]])
    return markdown(head, body)


def processor_table(rows: list[dict]) -> str:
    """Processor only, decoded image in: a JPEG and a PNG row are two samples of the same work."""
    head = ["size", "fmt"] + [LABELS[v] for v in PROCESSORS] + ["HF/ours u8", "HF/ours f32"]
    body = []
    for row in rows:
        m = row["median_ms"]
        cells = [row["size"], row["format"]] + [cell(m[v]) for v in PROCESSORS]
        cells += [f"{m['hf_proc_u8'] / m['ours_proc_u8']:.2f}x"]
        cells += [f"{m['hf_proc_f32'] / m['ours_proc_f32']:.2f}x"]
        body.append(cells)
    return markdown(head, body)


def concurrency_table(rows: list[dict]) -> str:
    pools = list(rows[0]["images_per_s"])
    head = ["pipeline"] + [f"{p}: items/s best (median)" for p in pools]
    head += [f"{p} / 1 thread (best)" for p in pools[1:]]
    body = []
    for row in rows:
        ips, med = row["images_per_s"], row["median_images_per_s"]
        cells = [LABELS[row["variant"]]] + [f"{ips[p]:.1f} ({med[p]:.1f})" for p in pools]
        body.append(cells + [f"{ips[p] / ips[pools[0]]:.2f}x" for p in pools[1:]])
    return markdown(head, body)


# The per-size CSV (--csv): one row per family, size and format; the medians of every variant
# and the ratios the tables print (HF over ours, decode share), so it can stand for both tables.
CSV_RATIOS = {
    "hf_over_ours_u8": ("hf_u8", "ours_u8"),
    "hf_over_ours_f32": ("hf_f32", "ours_f32"),
    "decode_share_u8": ("decode", "ours_u8"),
    "decode_share_f32": ("decode", "ours_f32"),
    "hf_over_ours_proc_u8": ("hf_proc_u8", "ours_proc_u8"),
    "hf_over_ours_proc_f32": ("hf_proc_f32", "ours_proc_f32"),
}
CSV_COLUMNS = ["family", "size", "format", "output", "same"]
CSV_COLUMNS += [f"{v}_ms" for v in VARIANTS] + list(CSV_RATIOS)


def write_csv(path: Path, families: dict[str, list[dict]]) -> None:
    """Every family's rows as CSV (CSV_COLUMNS): ms to 3 decimals, ratios to 2."""
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(CSV_COLUMNS)
        for rows in families.values():
            for row in rows:
                m = row["median_ms"]
                cells = [row[k] for k in ("family", "size", "format", "output", "same")]
                cells += [f"{m[v]:.3f}" for v in VARIANTS]
                cells += [f"{m[a] / m[b]:.2f}" for a, b in CSV_RATIOS.values()]
                writer.writerow(cells)


def machine() -> dict[str, object]:
    import torch
    import torchvision
    import transformers
    from PIL import __version__ as pillow

    model = platform.processor()
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        model = next(
            line.split(":", 1)[1].strip()
            for line in lscpu.splitlines()
            if line.startswith("Model name")
        )
    except (OSError, subprocess.CalledProcessError, StopIteration):
        pass
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "pillow": pillow,
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "transformers": transformers.__version__,
        "native_kernels": native.simd_level() or "not built (numpy resize)",
    }


def load_average() -> str:
    """Other work on the machine skews everything here, concurrency most: print it."""
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds, 2 sizes")
    parser.add_argument("--json", type=Path, help="also write every run's timings here")
    parser.add_argument(
        "--csv", type=Path, help="also write one row per family, size and format here"
    )
    parser.add_argument("--repeats", type=int, help="rounds per case (default 5, --quick 2)")
    parser.add_argument(
        "--family", action="append", choices=FAMILIES, help="only these (repeatable)"
    )
    parser.add_argument(
        "--no-fast-jpeg", action="store_true", help="decode JPEGs with Pillow too (as before)"
    )
    args = parser.parse_args()
    repeats = args.repeats or (2 if args.quick else 5)
    decode.FAST_JPEG = decode.FAST_JPEG and not args.no_fast_jpeg
    sizes = QUICK_SIZES if args.quick else SIZES
    started = time.perf_counter()

    load, load_name = vllm_loader()  # imports vLLM (and torch) before the thread settings below
    import torch

    torch.set_num_threads(1)
    info = machine()
    print(
        f"{info['cpu']}, {info['cores']} cores; numpy {info['numpy']}, Pillow {info['pillow']}, "
        f"torch {info['torch']}, torchvision {info['torchvision']}, "
        f"transformers {info['transformers']}; native kernels: {info['native_kernels']}"
    )
    print(f"single thread; median of {repeats} interleaved rounds; HF decode: {load_name}")
    print(f"our decode: multimodal.decode.decode_pixels, JPEG fast path {decode.FAST_JPEG}")
    print(f"load average at start (1/5/15 min): {load_average()}")

    encoded = {}
    for width, height in sizes:
        image = photo_like(width, height)
        for fmt in FORMATS:
            encoded[(width, height), fmt] = encode(image, fmt)

    report: dict[str, object] = {
        "machine": info,
        "repeats": repeats,
        "statistic": "median",
        "hf_decode": load_name,
        "fast_jpeg": decode.FAST_JPEG,
        "load_average": load_average(),
        "families": {},
    }
    with tempfile.TemporaryDirectory(prefix="preprocess-bench-") as tmp:
        families = args.family or list(FAMILIES)
        dirs = {name: FAMILIES[name](Path(tmp) / name.lower()) for name in families}
        for name, model_dir in dirs.items():
            rows = bench_family(name, model_dir, encoded, load, repeats)
            report["families"][name] = rows
            print(f"\n### {name}: decode + preprocess (ms/image (images/s), median of {repeats})\n")
            print(family_table(rows))
            print(f"\n{name}, processor only (decoded image in):\n")
            print(processor_table(rows))

        if "Qwen2.5-VL" not in dirs:
            return finish(report, started, args.json, args.csv)
        width, height = CONCURRENCY_SIZE
        data = encoded.get(((width, height), "JPEG")) or encode(photo_like(width, height), "JPEG")
        images = 6 if args.quick else 12
        load = load_average()
        rows = bench_concurrency(dirs["Qwen2.5-VL"], data, repeats, images)
        report["concurrency"] = rows
        report["concurrency_load_average"] = load
        print(
            f"\n### Concurrency: Qwen2.5-VL, {width}x{height} JPEG, batches of {images} images "
            f"(best and median of {repeats} batches; load average at start {load})\n"
        )
        print(concurrency_table(rows))
    finish(report, started, args.json, args.csv)


def finish(
    report: dict[str, object], started: float, path: Path | None, csv_path: Path | None = None
) -> None:
    elapsed = time.perf_counter() - started
    report["elapsed_s"] = elapsed
    print(f"\n{elapsed:.0f} s")
    if path:
        path.write_text(json.dumps(report, indent=2))
    if csv_path:
        write_csv(csv_path, report["families"])


if __name__ == "__main__":
    main()
