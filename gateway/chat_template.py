"""Chat templates rendered as transformers renders them (the environment vLLM relies on).

This is the minimal core shared by the gateway and `mmgate preprocess`; the gateway's chat
rendering (content-format detection, tools, continue_final_message) builds on it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    pass


def load_chat_template(model_dir: Path) -> str:
    """The template transformers would pick: chat_template.jinja, then tokenizer_config's."""
    model_dir = Path(model_dir)
    jinja_file = model_dir / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text()
    for name in ("tokenizer_config.json", "chat_template.json"):
        path = model_dir / name
        if path.is_file():
            template = json.loads(path.read_text()).get("chat_template")
            if isinstance(template, str):
                return template
    raise ChatTemplateError(f"no chat template in {model_dir}")


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    # Jinja's own tojson escapes HTML; templates expect plain JSON.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


@functools.lru_cache(maxsize=8)
def compile_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


def render(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    add_generation_prompt: bool = True,
    **variables: Any,
) -> str:
    try:
        return compile_template(template).render(
            messages=messages, add_generation_prompt=add_generation_prompt, **variables
        )
    except jinja2.exceptions.TemplateError as error:
        raise ChatTemplateError(f"chat template: {error}") from error
