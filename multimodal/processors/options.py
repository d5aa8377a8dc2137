"""Per-request processor options (vLLM's `mm_processor_kwargs`), typed.

Each family declares the keys it accepts as a frozen dataclass whose fields are `option(...)`s
(all optional: unset means the model's default); `parse_options` is the one validator. An
unknown key, a wrong type or a value out of range is an `OptionError`, answered with a 400 that
names the key, e.g. "mm_processor_kwargs.max_pixels must be a positive integer". A field typed
as another such dataclass is a nested object (Qwen-VL's `size`).
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from multimodal.errors import MmgateError

T = TypeVar("T")
KEY = "mm_processor_kwargs"


class OptionError(MmgateError):
    """A per-request processor option (mm_processor_kwargs) the family does not accept."""

    param = KEY


@dataclasses.dataclass(frozen=True)
class NoOptions:
    """Families whose token counts come from the model config alone accept no options: a
    per-request size would make the pixels disagree with the placeholder count."""


def option(*, minimum: int | None = None, doc: str = "") -> Any:
    """A field of an options class: None (the model's default) unless the request sets it."""
    return dataclasses.field(default=None, metadata={"minimum": minimum, "doc": doc})


def first_set(*values: T | None) -> T:
    """The first of `values` that is set (not None): a request's option over the model's
    default, e.g. first_set(options.max_patches, defaults.max_patches)."""
    return next(v for v in values if v is not None)


def parse_options(options: type[T], given: Any, family: str, key: str = KEY) -> T:
    """`given` (a request's JSON object) as an instance of `options`, or an OptionError."""
    if not isinstance(given, Mapping):
        raise OptionError(f"{key} must be an object")
    names = [f.name for f in dataclasses.fields(options)]
    if unknown := sorted(set(given) - set(names)):
        accepted = ", ".join(names) or "none"
        where = "mm_processor_kwargs" if key == KEY else key
        raise OptionError(f"unsupported {where} {unknown} for {family} (accepted: {accepted})")
    types_ = _field_types(options)
    values = {
        f.name: _checked(f"{key}.{f.name}", given[f.name], types_[f.name], f.metadata, family)
        for f in dataclasses.fields(options)
        if given.get(f.name) is not None
    }
    return options(**values)


@functools.cache
def _field_types(options: type) -> dict[str, type]:
    """Each field's type, without the `| None` every option carries."""
    hints = typing.get_type_hints(options)
    return {name: _without_none(hint) for name, hint in hints.items()}


def _without_none(hint: Any) -> Any:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        (kind,) = [a for a in typing.get_args(hint) if a is not type(None)]
        return kind
    return hint


def _checked(key: str, value: Any, kind: type, meta: Mapping[str, Any], family: str) -> Any:
    if dataclasses.is_dataclass(kind):
        return parse_options(kind, value, family, key)
    if kind is int:
        minimum = meta.get("minimum")
        if not isinstance(value, int) or isinstance(value, bool):
            raise OptionError(f"{key} must be {_integer(minimum)}")
        if minimum is not None and value < minimum:
            raise OptionError(f"{key} must be {_integer(minimum)}")
        return value
    if kind is bool:
        if not isinstance(value, bool):
            raise OptionError(f"{key} must be true or false")
        return value
    if kind is float:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise OptionError(f"{key} must be a number")
        return float(value)
    raise TypeError(f"option {key} has a type the validator does not know: {kind!r}")


def _integer(minimum: int | None) -> str:
    if minimum == 1:
        return "a positive integer"
    if minimum == 0:
        return "a non-negative integer"
    return "an integer" if minimum is None else f"an integer of at least {minimum}"
