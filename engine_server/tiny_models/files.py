"""Writing a tiny model directory: seeded weights, JSON configs, tokenizer and processor files,
in the layout both transformers 4.x and 5 (and so vLLM) read."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Every tiny model's weights come from this seed: the same files on every machine.
SEED = 1234


def seeded_model(factory: Callable[[], Any]) -> Any:
    """`factory()` (a torch module built with random init) under torch seed SEED, in eval
    mode. The caller's global RNG state is left as it was."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        return factory().eval()


def save_model(model: Any, out_dir: Path, **generation_token_ids: Any) -> None:
    """`model.save_pretrained(out_dir)` with a generation_config.json of only
    `generation_token_ids` (bos_token_id, eos_token_id, pad_token_id): vLLM turns any sampling
    fields there into request defaults."""
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig(**generation_token_ids)
    model.save_pretrained(out_dir)


def write_json(path: Path, data: Any) -> None:
    """`data` as indented JSON with sorted keys and a final newline (stable bytes)."""
    path.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def patch_tokenizer_files(out_dir: Path, tokenizer: Any, template: str | None) -> None:
    """Make the tokenizer files transformers 5 wrote in `out_dir` readable by older readers:
    the generic fast tokenizer class, the chat template (if any) inside tokenizer_config.json,
    and a special_tokens_map.json."""
    # transformers 5 records the class as "TokenizersBackend" (unknown to 4.x),
    # keeps the template only in chat_template.jinja and writes no
    # special_tokens_map.json. Older readers need all three; naming the generic
    # fast class also guarantees tokenizer.json is used verbatim everywhere.
    path = out_dir / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    if template is not None:
        cfg["chat_template"] = template
    write_json(path, cfg)
    write_json(out_dir / "special_tokens_map.json", tokenizer.special_tokens_map)


def save_tokenizer(tokenizer: Any, out_dir: Path, template: str | None = None) -> None:
    """The tokenizer's files in `out_dir`, patched for older readers (patch_tokenizer_files)."""
    tokenizer.save_pretrained(out_dir)
    patch_tokenizer_files(out_dir, tokenizer, template)


def save_processor(
    processor: Any,
    tokenizer: Any,
    out_dir: Path,
    template: str,
    preprocessor: dict[str, Any] | None = None,
) -> None:
    """The processor's files in `out_dir` (tokenizer files, chat_template.jinja,
    processor_config.json), its tokenizer's patched for older readers, and with `preprocessor`
    a flat preprocessor_config.json of it: released checkpoints ship that (transformers 4.x
    layout); transformers 5 nests the same settings in processor_config.json."""
    processor.save_pretrained(out_dir)
    patch_tokenizer_files(out_dir, tokenizer, template)
    if preprocessor is not None:
        write_json(out_dir / "preprocessor_config.json", preprocessor)
