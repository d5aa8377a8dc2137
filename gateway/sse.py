"""Server-sent events for streamed completions.

Every chunk of a response repeats id, object, created and model; they are encoded once per
response instead of once per token (the stream's per-token cost is what a gateway is judged by).
"""

from __future__ import annotations

import json
from typing import Any

DONE = "data: [DONE]\n\n"


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def data(body: Any) -> str:
    return f"data: {dumps(body)}\n\n"


class ChunkWriter:
    def __init__(self, id: str, object: str, created: int, model: str) -> None:  # noqa: A002
        fixed = dumps({"id": id, "object": object, "created": created, "model": model})
        self._head = f'data: {fixed[:-1]}, "choices": '

    def chunk(self, choices: list[dict], usage: dict | None = None) -> str:
        """The same text as data({...fixed, "choices": choices[, "usage": usage]})."""
        tail = f', "usage": {dumps(usage)}' if usage is not None else ""
        return f"{self._head}{dumps(choices)}{tail}}}\n\n"
