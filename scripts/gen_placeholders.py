"""Regenerate multimodal/placeholders.json from the installed vLLM.

When a chat template takes message content as a plain string, vLLM's OpenAI server writes, for
the i-th item of a modality, `model_cls.get_placeholder_str(modality, i)` into the prompt
(vllm/renderers/chat_utils.py), `model_cls` being the class its model registry resolves the
model's architecture to. The gateway must not import vLLM, so it reads that text from a table
this script writes (multimodal/placeholders.py loads it).

For every multimodal architecture in vLLM's registry (those of its `_MULTIMODAL_MODELS` section
and any other registered architecture whose class supports multimodal input: embedding, ranking
and retrieval models, the Transformers backend, MTP drafters) the script loads the class the
way the registry does (`ModelRegistry.models[arch].load_model_cls()`, what
`_ModelRegistry._try_load_model_cls` calls) and asks it for the "image", "video" and "audio"
placeholders of items 1 and 2. Text that differs between the two only by the index becomes a
template with `{i}` (Phi-3-vision's `<|image_{i}|>`); None or an exception leaves the modality
out. Architectures whose module does not import here (a missing optional dependency, a CUDA-only
module) are skipped and listed on stderr. Out-of-tree (plugin) models are not included.

    .venv/bin/python scripts/gen_placeholders.py           # write the table
    .venv/bin/python scripts/gen_placeholders.py --check   # exit 1 if it is out of date
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

OUTPUT = Path(__file__).resolve().parents[1] / "multimodal" / "placeholders.json"
MODALITIES = ("image", "video", "audio")
INDEX = "{i}"

# Architectures the registry resolves, on some platforms, to a stub without the multimodal
# interface: the class the GPU platforms load instead. On CPU vllm.models.deepseek_v4 exports
# vl_stub.DeepseekV4ForConditionalGeneration, which raises NotImplementedError when built.
PLATFORM_STUB_FALLBACKS = {
    "DeepseekV4ForConditionalGeneration": (
        "vllm.models.deepseek_v4.common.vl_model",
        "DeepseekV4ForConditionalGeneration",
    ),
}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def placeholder(model_cls: type, modality: str, index: int) -> str | None:
    try:
        text = model_cls.get_placeholder_str(modality, index)
    except Exception:
        return None
    return text if isinstance(text, str) else None


def index_template(first: str, second: str) -> str | None:
    """`first` with `{i}` for the 1s that are 2s in `second`, if that is all they differ by."""
    parts = first.split("1")
    if len(parts) > 12:  # 2**11 candidates; no placeholder is anywhere near that
        return None
    for is_index in itertools.product((False, True), repeat=len(parts) - 1):
        if not any(is_index):
            continue
        template = parts[0]
        for part, index in zip(parts[1:], is_index):
            template += (INDEX if index else "1") + part
        if template.replace(INDEX, "2") == second:
            return template
    return None


def placeholders(arch: str, model_cls: type, problems: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for modality in MODALITIES:
        first, second = (placeholder(model_cls, modality, i) for i in (1, 2))
        if first is None or second is None:
            if first != second:
                problems.append(f"{arch} {modality}: item 1 -> {first!r}, item 2 -> {second!r}")
            continue
        if INDEX in first or INDEX in second:
            raise SystemExit(f"{arch} {modality}: {first!r} contains {INDEX}, the index marker")
        if first == second:
            found[modality] = first
            continue
        template = index_template(first, second)
        if template is None:
            problems.append(f"{arch} {modality}: {first!r} and {second!r} differ beyond the index")
            found[modality] = first
            continue
        for i in (3, 12):  # the template should hold past the two items it was read from
            if template.replace(INDEX, str(i)) != placeholder(model_cls, modality, i):
                problems.append(f"{arch} {modality}: {template!r} does not give item {i}")
        found[modality] = template
    return found


def generate() -> tuple[dict[str, Any], list[str], list[str]]:
    """The table, the skipped architectures (with why) and the oddities worth a look."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    started = time.monotonic()
    import vllm
    from vllm.model_executor.models.interfaces import supports_multimodal
    from vllm.model_executor.models.registry import _MULTIMODAL_MODELS, ModelRegistry

    log(f"vLLM {vllm.__version__} imported in {time.monotonic() - started:.1f}s")
    archs = sorted(ModelRegistry.get_supported_archs())
    table: dict[str, dict[str, str]] = {}
    skipped: list[str] = []
    problems: list[str] = []
    for n, arch in enumerate(archs, 1):
        listed = arch in _MULTIMODAL_MODELS
        progress = f"[{n}/{len(archs)}] {arch}"
        loaded = time.monotonic()
        try:
            model_cls = ModelRegistry.models[arch].load_model_cls()
        except Exception as e:
            kind = "multimodal" if listed else "multimodal or not: unknown"
            skipped.append(f"{arch} ({kind}): {type(e).__name__}: {str(e).splitlines()[0]}")
            log(f"{progress}: SKIPPED, does not import ({type(e).__name__})")
            continue
        seconds = time.monotonic() - loaded
        slow = f" ({seconds:.1f}s)" if seconds > 1 else ""
        if not supports_multimodal(model_cls) and listed and arch in PLATFORM_STUB_FALLBACKS:
            module, name = PLATFORM_STUB_FALLBACKS[arch]
            log(f"{progress}: a platform stub here; using {module}.{name}")
            try:
                model_cls = getattr(importlib.import_module(module), name)
            except Exception as e:
                skipped.append(f"{arch} (multimodal): its {module} {type(e).__name__}: {e}")
                log(f"{progress}: SKIPPED, {module} does not import ({type(e).__name__})")
                continue
        if not supports_multimodal(model_cls):
            if listed:
                skipped.append(
                    f"{arch} (multimodal): {model_cls.__module__} has no multimodal class"
                )
                log(f"{progress}: SKIPPED, the class is not multimodal here")
            continue
        table[arch] = placeholders(arch, model_cls, problems)
        log(f"{progress}{slow}: {table[arch] or 'no placeholders'}")
    log(f"{len(archs)} architectures looked at in {time.monotonic() - started:.1f}s")
    return {"vllm_version": vllm.__version__, "architectures": table}, skipped, problems


def render(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=OUTPUT, help="default: %(default)s")
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if the file is out of date"
    )
    args = parser.parse_args()

    data, skipped, problems = generate()
    table = data["architectures"]
    templates = sorted(
        f"{arch} {modality}"
        for arch, entry in table.items()
        for modality, text in entry.items()
        if INDEX in text
    )
    log(
        f"{len(table)} multimodal architectures, {sum(bool(e) for e in table.values())} with "
        f"placeholders, {len(templates)} index templates: {', '.join(templates)}"
    )
    if skipped:
        log(f"{len(skipped)} skipped:\n  " + "\n  ".join(skipped))
    if problems:
        log(f"{len(problems)} to look at:\n  " + "\n  ".join(problems))

    text = render(data)
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != text:
            log(f"{args.output} is out of date; run {Path(__file__).name} to regenerate it")
            return 1
        log(f"{args.output} is up to date")
        return 0
    args.output.write_text(text, encoding="utf-8")
    log(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
