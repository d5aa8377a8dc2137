"""Which chat template renders a request, and the Jinja environment it runs in.

Selection is vLLM's `resolve_chat_template` (vllm/renderers/hf.py): `--chat-template` (a
literal, or the name of one of the tokenizer's named templates) > the processor's template
(only when the request has no tools) > the tokenizer's (`tool_use` when there are tools, else
`default`) > vLLM's built-in fallback for the model_type.

The environment is transformers' (`render_jinja_template`): a sandbox with trim_blocks and
lstrip_blocks, loop controls, a `tojson` that does not escape HTML, `raise_exception`,
`strftime_now`, and the `{% generation %}` tag for assistant masks.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from gateway.errors import ChatRequestError
from gateway.render.model_files import ChatTemplates


def select_template(
    templates: ChatTemplates, chat_template: str | None, tools: Sequence[Any] | None
) -> str:
    """vLLM's resolve_chat_template."""
    if chat_template is None and tools is None and templates.processor is not None:
        return templates.processor
    named = templates.tokenizer
    if isinstance(named, dict):
        if chat_template is not None:
            return named.get(chat_template, chat_template)
        if tools is not None and "tool_use" in named:
            return named["tool_use"]
        if "default" in named:
            return named["default"]
        if templates.fallback is not None:
            return templates.fallback
        raise ChatRequestError(
            f"the model has several chat templates and no default: {sorted(named)}"
        )
    template = chat_template if chat_template is not None else named
    if template is None:
        template = templates.fallback
    if template is None:
        raise ChatRequestError(
            "the model has no chat template; start the gateway with --chat-template"
        )
    return template


def read_chat_template_arg(value: str) -> str:
    """A --chat-template argument as vLLM's load_chat_template reads it: a file, else a literal."""
    try:
        return Path(value).read_text(encoding="utf-8")
    except OSError as error:
        # vLLM would also look in its built-in template folder, which the gateway lacks.
        if not any(c in value for c in "{}\n"):
            raise ChatRequestError(
                f"chat template {value!r} looks like a file path, but it cannot be read: {error}"
            ) from error
    return value


class _GenerationTag(jinja2.ext.Extension):
    # transformers' AssistantTracker: marks assistant text for masks; when rendering a
    # prompt it just outputs its body. Templates using it would not even parse without it.
    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_body")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    # Jinja's own tojson escapes HTML; templates expect plain JSON.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols, _GenerationTag],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


@functools.lru_cache(maxsize=32)
def compile_chat_template(source: str) -> jinja2.Template:
    try:
        return environment().from_string(source)
    except jinja2.TemplateError as error:
        raise ChatRequestError(f"chat template does not compile: {error}") from error
