"""Tool calls in pieces: one call being assembled, the prefix of its arguments that is safe to
stream, the name and arguments of a body holding both, and streamed pieces merged per call."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from gateway.parsers.base import DeltaToolCall


@dataclass
class Slot:
    """One tool call being assembled."""

    id: str = ""
    name: str = ""
    args: str = ""
    name_sent: bool = False
    string_keys: set[str] | None = None
    streamed_json: str = ""


# A call's name in the text of its arguments (vLLM's ``_try_extract_name``).
NAME_RE = re.compile(r'"name"\s*:\s*"([^"]*)"')


def safe_arg_prefix(json_str: str, string_keys: set[str] | None) -> str:
    """The prefix of the arguments JSON that later text cannot change (vLLM streams only
    that): up to the last top-level value, plus an open string value of a string field."""
    last_colon, last_key, pending_key = -1, None, None
    in_string = escape = False
    string_start, depth = -1, 0
    for i, c in enumerate(json_str):
        if escape:
            escape = False
        elif in_string:
            if c == "\\":
                escape = True
            elif c == '"':
                in_string = False
                if depth == 1 and string_start >= 0:
                    pending_key = json_str[string_start + 1 : i]
        elif c == '"':
            in_string, string_start = True, i
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
        elif c == ":" and depth == 1:
            last_colon, last_key, pending_key = i, pending_key, None
    if last_colon < 0:
        return ""
    end = last_colon + 1
    while end < len(json_str) and json_str[end] in " \t\n\r":
        end += 1
    if end >= len(json_str) or json_str[end] != '"':
        return json_str[:end]
    if string_keys is not None and last_key not in string_keys:
        return json_str[:end]
    escape = False
    for i in range(end + 1, len(json_str)):
        if escape:
            escape = False
        elif json_str[i] == "\\":
            escape = True
        elif json_str[i] == '"':
            return json_str[:i]
    return json_str


def split_name_and_args(raw_body: str) -> tuple[Any, str]:
    """(name, arguments JSON) of a JSON body naming its call (``"name"`` and ``"arguments"``
    or ``"parameters"``, or the other keys); ("", the text) when it is not a JSON object."""
    raw_body = raw_body.strip()
    try:
        parsed = json.loads(raw_body)
    except ValueError:
        return "", raw_body
    if not isinstance(parsed, dict):
        return "", raw_body
    name = parsed.get("name", "")
    for key in ("arguments", "parameters"):
        if key in parsed:
            value = parsed[key]
            return name, value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    without_name = {k: v for k, v in parsed.items() if k != "name"}
    return name, json.dumps(without_name, ensure_ascii=False)


def coalesce_pieces(calls: list[DeltaToolCall]) -> list[DeltaToolCall]:
    """One piece per call index, as vLLM merges them."""
    merged: dict[int, DeltaToolCall] = {}
    for piece in calls:
        existing = merged.get(piece.index)
        if existing is None:
            merged[piece.index] = piece
            continue
        existing.id = existing.id if existing.id is not None else piece.id
        existing.type = existing.type if existing.type is not None else piece.type
        existing.name = existing.name if existing.name is not None else piece.name
        if piece.arguments is not None:
            existing.arguments = (existing.arguments or "") + piece.arguments
    return calls if len(merged) == len(calls) else list(merged.values())
