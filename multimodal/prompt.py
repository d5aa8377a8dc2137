"""Placeholder expansion: one anchor token per image in, the model's full replacement out."""

from __future__ import annotations

from collections.abc import Sequence


class PromptError(ValueError):
    """The prompt's anchors do not match the images sent with it."""


def expand(
    ids: Sequence[int], anchor_id: int, replacements: Sequence[Sequence[int]]
) -> tuple[list[int], list[tuple[int, int]]]:
    """Replace the i-th anchor with replacements[i]; return new ids and (offset, length) ranges."""
    anchors = [i for i, token in enumerate(ids) if token == anchor_id]
    if len(anchors) != len(replacements):
        raise PromptError(
            f"the prompt has {len(anchors)} image placeholders for {len(replacements)} images"
        )
    out: list[int] = []
    ranges: list[tuple[int, int]] = []
    previous = 0
    for position, replacement in zip(anchors, replacements):
        out.extend(ids[previous:position])
        ranges.append((len(out), len(replacement)))
        out.extend(replacement)
        previous = position + 1
    out.extend(ids[previous:])
    return out, ranges
