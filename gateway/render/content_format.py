"""Which content format a chat template takes: vLLM's `_detect_content_format`, a walk over the
template's Jinja AST.

"openai" when the template loops over a message's content (`{% for part in message.content %}`
or kin: aliases of `messages`, macros given `message.content`, a bare `content` variable),
else "string". Templates the walk cannot read (vLLM's `assert`s) are "string", as in vLLM.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Iterator
from typing import Literal

import jinja2
import jinja2.nodes

from gateway.errors import ChatRequestError
from gateway.render.templates import compile_chat_template, environment

ContentFormat = Literal["string", "openai"]


class _AstShapeError(Exception):
    """Where vLLM's walk hits an `assert` (e.g. a tuple loop target) and falls back."""


def _target_name(node: jinja2.nodes.Node) -> str:
    if not isinstance(node, jinja2.nodes.Name):
        raise _AstShapeError
    return node.name


def _is_var_access(node: jinja2.nodes.Node, varname: str) -> bool:
    return isinstance(node, jinja2.nodes.Name) and node.ctx == "load" and node.name == varname


def _is_attr_access(node: jinja2.nodes.Node, varname: str, key: str) -> bool:
    if isinstance(node, jinja2.nodes.Getitem):
        return (
            _is_var_access(node.node, varname)
            and isinstance(node.arg, jinja2.nodes.Const)
            and node.arg.value == key
        )
    if isinstance(node, jinja2.nodes.Getattr):
        return _is_var_access(node.node, varname) and node.attr == key
    return False


def _is_var_or_elems_access(node: jinja2.nodes.Node, varname: str, key: str | None = None) -> bool:
    if isinstance(node, jinja2.nodes.Filter):
        return node.node is not None and _is_var_or_elems_access(node.node, varname, key)
    if isinstance(node, jinja2.nodes.Test):
        return _is_var_or_elems_access(node.node, varname, key)
    if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice):
        return _is_var_or_elems_access(node.node, varname, key)
    return _is_attr_access(node, varname, key) if key else _is_var_access(node, varname)


def _aliases(root: jinja2.nodes.Template, varname: str) -> list[str]:
    """`varname` and every variable assigned from it, transitively ({% set m = messages %})."""
    names, queue = [varname], deque([varname])
    while queue:
        current = queue.popleft()
        for assign in root.find_all(jinja2.nodes.Assign):
            if _is_var_or_elems_access(assign.node, current):
                name = _target_name(assign.target)
                names.append(name)
                # vLLM's walk has no visited set and loops forever on `a = b; b = a`.
                if name not in names[:-1]:
                    queue.append(name)
    return names


def _message_loop_vars(root: jinja2.nodes.Template) -> list[str]:
    """Loop variables of `{% for message in messages %}` (or an alias of messages)."""
    found = []
    aliases = _aliases(root, "messages")
    for loop in root.find_all(jinja2.nodes.For):
        if any(_is_var_or_elems_access(loop.iter, name) for name in aliases):
            found.append(_target_name(loop.target))
    return found


def _macro_content_params(
    root: jinja2.nodes.Template, message_vars: list[str]
) -> tuple[dict[int, set[str]], set[int]]:
    """Macro parameters that receive `message.content`, per loop inside those macros."""
    params_by_loop: dict[int, set[str]] = {}
    loops_in_macros: set[int] = set()
    for macro in root.find_all(jinja2.nodes.Macro):
        param_names = {arg.name for arg in macro.args}
        content_params: set[str] = set()
        for call in root.find_all(jinja2.nodes.Call):
            if not (isinstance(call.node, jinja2.nodes.Name) and call.node.name == macro.name):
                continue
            for i, arg in enumerate(call.args):
                if i < len(macro.args) and _is_content_access(arg, message_vars):
                    content_params.add(macro.args[i].name)
            for kwarg in call.kwargs:
                if kwarg.key in param_names and _is_content_access(kwarg.value, message_vars):
                    content_params.add(kwarg.key)
        for loop in macro.find_all(jinja2.nodes.For):
            loops_in_macros.add(id(loop))
            if content_params:
                params_by_loop[id(loop)] = content_params
    return params_by_loop, loops_in_macros


def _is_content_access(node: jinja2.nodes.Node, message_vars: list[str]) -> bool:
    return any(_is_var_or_elems_access(node, name, "content") for name in message_vars)


def _content_loops(root: jinja2.nodes.Template) -> Iterator[str]:
    """Loops over a message's content: `{% for part in message['content'] %}` and kin."""
    message_vars = _message_loop_vars(root)
    params_by_loop, loops_in_macros = _macro_content_params(root, message_vars)
    for loop in root.find_all(jinja2.nodes.For):
        it = loop.iter
        params = params_by_loop.get(id(loop), set())
        via_macro = isinstance(it, jinja2.nodes.Name) and it.name in params
        # A bare `content` variable outside macros is usually `set content = message.content`.
        bare = id(loop) not in loops_in_macros and _is_var_access(it, "content")
        if _is_content_access(it, message_vars) or via_macro or bare:
            yield _target_name(loop.target)


@functools.lru_cache(maxsize=32)
def detect_content_format(template: str) -> ContentFormat:
    try:
        compile_chat_template(template)  # vLLM compiles first: e.g. an unknown filter fails here
        root = environment().parse(template)
    except (ChatRequestError, jinja2.TemplateError):
        return "string"
    try:
        next(_content_loops(root))
    except StopIteration:
        return "string"
    except _AstShapeError:
        return "string"
    return "openai"
