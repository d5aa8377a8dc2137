"""The text vLLM writes into a "string"-format chat prompt for each image, video or audio item,
for models the gateway has no processor of its own for.

When a chat template takes message content as a plain string, vLLM's OpenAI server puts, where
the i-th item of a modality was, `model_cls.get_placeholder_str(modality, i)`: a classmethod of
the class its model registry resolves the model's architecture to. The gateway must not import
vLLM (or torch), so placeholders.json, next to this module, holds what that returns for every
multimodal architecture in vLLM's registry: per architecture, a text per modality it has one
for, `{i}` standing for the item's index where vLLM puts it in (Phi-3-vision's `<|image_{i}|>`).
An architecture with an empty entry is multimodal, but vLLM writes nothing for its items.

The table is generated from the installed vLLM, and records its version; after upgrading vLLM,
regenerate it and commit the result:

    .venv/bin/python scripts/gen_placeholders.py

(`--check` says whether it is out of date; a slow test in
tests/unit/multimodal/test_placeholders.py compares it with vLLM.)

Lookups are by the names in the model config's `architectures`, as vLLM resolves them: the first
one the table knows wins. Not reproduced: vLLM's fallback to its Transformers backend for an
architecture it does not register, its renaming of a converted architecture (`...ForEmbedding`
to the model it converts), and out-of-tree (plugin) models.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import cache
from importlib.resources import files

INDEX = "{i}"  # in a template, where the item's index goes

__all__ = ["INDEX", "known_modalities", "placeholder_for", "vllm_version"]


@cache
def _data() -> Mapping[str, object]:
    text = files(__package__).joinpath("placeholders.json").read_text(encoding="utf-8")
    return json.loads(text)


def _entry(architectures: Sequence[str]) -> Mapping[str, str] | None:
    table: Mapping[str, Mapping[str, str]] = _data()["architectures"]  # type: ignore[assignment]
    if isinstance(architectures, str):
        architectures = (architectures,)
    for architecture in architectures:
        entry = table.get(architecture)
        if entry is not None:
            return entry
    return None


def placeholder_for(architectures: Sequence[str], modality: str, index: int) -> str | None:
    """What vLLM writes for the `index`-th (from 1) `modality` item of a prompt, None if nothing
    or if no architecture is known."""
    template = (_entry(architectures) or {}).get(modality)
    return None if template is None else template.replace(INDEX, str(index))


def known_modalities(architectures: Sequence[str]) -> frozenset[str]:
    """The modalities vLLM writes placeholder text for with these architectures."""
    return frozenset(_entry(architectures) or ())


def vllm_version() -> str:
    """The vLLM the table was generated from."""
    return str(_data()["vllm_version"])
