"""Placeholder expansion, the one place it happens: each media item's anchor token in the
rendered prompt becomes the model's full replacement for that item.

The chat template writes one anchor per item (Qwen2-VL: `<|image_pad|>`, LLaVA: `<image>`);
the i-th anchor of a modality belongs to that modality's i-th item, as in vLLM's processors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from multimodal.errors import MmgateError

Range = tuple[int, int]  # (offset, length) in the expanded ids


class PromptError(MmgateError):
    """The prompt's anchors do not match the items sent with it."""

    param = "mm_processor_kwargs"


@dataclass(frozen=True)
class Placeholders:
    """One modality's anchor token and, per item in prompt order, what replaces it."""

    modality: str
    anchor_id: int
    replacements: Sequence[Sequence[int]]


def expand(
    ids: Sequence[int], groups: Sequence[Placeholders]
) -> tuple[list[int], list[list[Range]]]:
    """The ids with every anchor replaced, and each group's ranges (in the order of `groups`)."""
    by_anchor = {group.anchor_id: index for index, group in enumerate(groups)}
    positions: list[list[int]] = [[] for _ in groups]
    for position, token in enumerate(ids):
        index = by_anchor.get(token)
        if index is not None:
            positions[index].append(position)
    for group, found in zip(groups, positions):
        if len(found) != len(group.replacements):
            raise PromptError(
                f"the prompt has {len(found)} {group.modality} placeholders for "
                f"{len(group.replacements)} {group.modality}s"
            )
    out: list[int] = []
    ranges: list[list[Range]] = [[] for _ in groups]
    taken = [0] * len(groups)
    previous = 0
    for position in sorted(p for found in positions for p in found):
        index = by_anchor[ids[position]]
        replacement = groups[index].replacements[taken[index]]
        taken[index] += 1
        out.extend(ids[previous:position])
        ranges[index].append((len(out), len(replacement)))
        out.extend(replacement)
        previous = position + 1
    out.extend(ids[previous:])
    return out, ranges
