"""Tool call arguments coerced to the types of the request's tool schemas
(``vllm/tool_parsers/utils.py``)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any


def find_tool_properties(tools: Sequence[Mapping[str, Any]] | None, name: str) -> dict:
    """The ``properties`` of the named tool's parameters in OpenAI chat ``tools``, or {}."""
    for tool in tools or ():
        function = tool.get("function") if tool.get("type", "function") == "function" else None
        if isinstance(function, Mapping) and function.get("name") == name:
            properties = (function.get("parameters") or {}).get("properties", {})
            # Malformed ones (the gateway does not validate tools) coerce nothing.
            return properties if isinstance(properties, dict) else {}
    return {}


def find_tool_name(tools: Sequence[Mapping[str, Any]] | None, name: str) -> bool:
    for tool in tools or ():
        function = tool.get("function") if tool.get("type", "function") == "function" else None
        if isinstance(function, Mapping) and function.get("name") == name:
            return True
    return False


_ENUM_TYPES = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"))


def extract_types_from_schema(schema: Any) -> list[str]:
    if not isinstance(schema, dict):
        return ["string"]
    types: set[str] = set()
    declared = schema.get("type")
    if isinstance(declared, str):
        types.add(declared)
    elif isinstance(declared, list):
        types.update(t for t in declared if isinstance(t, str))
    enum = schema.get("enum")
    if isinstance(enum, list):
        for value in enum:
            types.add(_enum_type(value))
    for choice_field in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(choice_field), list):
            for choice in schema[choice_field]:
                types.update(extract_types_from_schema(choice))
    return list(types) if types else ["string"]


def _enum_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return next(name for kind, name in _ENUM_TYPES if isinstance(value, kind))


_TYPE_ALIASES = {
    **dict.fromkeys(("str", "text", "varchar", "char", "enum"), "string"),
    **dict.fromkeys(
        ("int", "int32", "int64", "uint", "uint32", "uint64", "long", "short", "unsigned"),
        "integer",
    ),
    **dict.fromkeys(("float", "float32", "float64", "double"), "number"),
    "bool": "boolean",
    "dict": "object",
    **dict.fromkeys(("arr", "list", "sequence"), "array"),
}
_MISSING = object()


def _is_json_finite(obj: Any) -> bool:
    if isinstance(obj, float):
        return math.isfinite(obj)
    if isinstance(obj, list):
        return all(_is_json_finite(v) for v in obj)
    if isinstance(obj, dict):
        return all(_is_json_finite(v) for v in obj.values())
    return True


def _coerce_as(value: str, kind: str) -> Any:
    """``value`` as JSON type ``kind``, or ``_MISSING``."""
    if kind == "null":
        return None if value.lower() == "null" else _MISSING
    if kind == "string":
        return value
    if kind == "integer":
        try:
            return int(value)
        except ValueError:
            return _MISSING
    if kind == "number":
        try:
            number = float(value)
        except ValueError:
            return _MISSING
        if not math.isfinite(number):
            return _MISSING
        return number if number != int(number) else int(number)
    if kind == "boolean":
        lowered = value.lower().strip()
        return {"true": True, "1": True, "false": False, "0": False}.get(lowered, _MISSING)
    try:
        parsed = json.loads(value)
    except ValueError:
        return _MISSING
    return parsed if _is_json_finite(parsed) else _MISSING


def coerce_to_schema_type(value: str, schema_types: list[str]) -> Any:
    """vLLM's best-effort coercion of a raw string to the first fitting schema type."""
    normalized = {_TYPE_ALIASES.get(t.strip().lower(), t.strip().lower()) for t in schema_types}
    for kind in ("null", "integer", "number", "boolean", "object", "array", "string"):
        if kind in normalized and (coerced := _coerce_as(value, kind)) is not _MISSING:
            return coerced
    try:
        parsed = json.loads(value)
    except ValueError:
        return value
    return parsed if _is_json_finite(parsed) else value


def _coerce_value(value: Any, schema: dict) -> tuple[Any, bool]:
    if isinstance(value, str):
        coerced = coerce_to_schema_type(value, extract_types_from_schema(schema))
        return (coerced, True) if coerced is not value else (value, False)
    if isinstance(value, dict):
        nested = schema.get("properties")
        if isinstance(nested, dict):
            return value, coerce_dict(value, nested)
        return value, False
    if isinstance(value, list):
        items = schema.get("items")
        changed = False
        if isinstance(items, dict):
            for i, item in enumerate(value):
                coerced, item_changed = _coerce_value(item, items)
                if item_changed:
                    value[i] = coerced
                    changed = True
        return value, changed
    as_str = json.dumps(value, ensure_ascii=False)
    coerced = coerce_to_schema_type(as_str, extract_types_from_schema(schema))
    if type(coerced) is not type(value) or coerced != value:
        return coerced, True
    return value, False


def coerce_dict(args: dict, properties: dict) -> bool:
    changed = False
    for key, value in args.items():
        prop = properties.get(key)
        if isinstance(prop, dict):
            coerced, value_changed = _coerce_value(value, prop)
            if value_changed:
                args[key] = coerced
                changed = True
    return changed


def streamable_string_keys(properties: dict) -> set[str] | None:
    if not properties:
        return None
    return {k for k, s in properties.items() if set(extract_types_from_schema(s)) == {"string"}}
