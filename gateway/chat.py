"""Chat requests rendered to token ids exactly as vLLM's OpenAI server renders them.

The gateway never imports vLLM, so this module replicates, step by step, what
`vllm serve` does for /v1/chat/completions with an HF tokenizer (`vllm/renderers/hf.py`,
`vllm/renderers/chat_utils.py`, `ChatCompletionRequest.build_chat_params`):

1. Template: `--chat-template` (a literal, or the name of one of the tokenizer's named
   templates) > the processor's template (only when the request has no tools) > the
   tokenizer's (`tool_use` when there are tools, else `default`).
2. Content format: "openai" when the template loops over a message's content (found in the
   Jinja AST by the same walk as vLLM's `_detect_content_format`), else "string".
   "string": text parts joined with "\\n", and one placeholder per image *prepended* (joined
   with "\\n") unless the text already contains it. The placeholder text is what vLLM's
   model class returns from `get_placeholder_str` (e.g. Qwen2-VL's
   `<|vision_start|><|image_pad|><|vision_end|>`); we take it from the model's
   `multimodal` processor (`ImageProcessor.placeholder_text`), which mirrors it per family.
   "openai": content becomes `[{"type": "text", "text": ...}, {"type": "image"}, ...]`.
3. Message post-processing: assistant tool-call arguments JSON strings -> dicts, tool
   content lists -> strings, `developer` -> `system` (merged) when the template does not
   know the developer role.
4. Rendering as transformers' `apply_chat_template(tokenize=False)`: the special-token
   strings, the request's `chat_template_kwargs`, `tools`, `documents` and
   `add_generation_prompt`; `continue_final_message` cuts the prompt after the last message.
5. Tokenizing the prompt text with `add_special_tokens=False` (the chat default: the
   template already wrote any BOS).
"""

from __future__ import annotations

import copy
import functools
import json
from collections import Counter, deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import jinja2
import jinja2.ext
import jinja2.nodes
from tokenizers import Tokenizer

from gateway.chat_template import compile_template
from multimodal.registry import UnsupportedModel, processor_for

ContentFormat = Literal["string", "openai"]


class ChatRequestError(ValueError):
    """The request cannot be rendered; the message is safe to return to the client (400)."""


@dataclass
class RenderedChat:
    prompt: str
    token_ids: list[int]
    # Images in the order vLLM hands them to the model's processor, which matches them to
    # the prompt's placeholders in order.
    image_urls: list[tuple[str, str | None]] = field(default_factory=list)  # (url, detail)


# vLLM passes any role string to the template; the gateway only accepts OpenAI's roles.
ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})

# Part type -> the key holding its text (vLLM's TEXT_PART_TYPES / MM_PARSER_MAP).
_TEXT_PARTS = {
    "text": "text",
    "input_text": "text",
    "output_text": "text",
    "refusal": "refusal",
    "thinking": "thinking",
}
# Fields of vLLM's content-part TypedDicts: in the "openai" format every other key of a
# part is copied onto the part the template sees (`_collect_extra_fields`).
_KNOWN_PART_FIELDS = frozenset(
    {
        "audio_embeds", "audio_url", "closed", "data", "file", "image_embeds", "image_pil",
        "image_url", "input_audio", "name", "prompt_cache_breakpoint", "refusal", "text",
        "thinking", "type", "uuid", "video_embeds", "video_url",
    }
)  # fmt: skip
_IMAGE_MARKER = "<##IMAGE##>"  # vLLM's MODALITY_PLACEHOLDERS_MAP["image"]
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "  # transformers' render_jinja_template
_BILLING_HEADER = "x-anthropic-billing-header"

# apply_chat_template arguments that never reach the template and do not change the text
# when tokenize=False; vLLM accepts and ignores them.
_IGNORED_KWARGS = frozenset(
    {"padding", "truncation", "max_length", "return_tensors", "return_dict", "tokenizer_kwargs"}
)
# Keys that would change which template runs or make vLLM fail; refused outright.
_REFUSED_KWARGS = frozenset(
    {"chat_template", "tokenize", "messages", "conversation", "return_assistant_tokens_mask"}
)
# Standard named special tokens transformers passes to every template (SPECIAL_TOKENS_ATTRIBUTES).
_SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


# ---------------------------------------------------------------------------------------------
# Template sources and selection


@dataclass(frozen=True)
class TemplateSources:
    """The templates transformers would load for the model's tokenizer and processor."""

    tokenizer: str | dict[str, str] | None  # a dict when the tokenizer has named templates
    processor: str | None  # AutoProcessor's, for models that have a processor


def read_template_sources(model_dir: Path) -> TemplateSources:
    model_dir = Path(model_dir)
    return TemplateSources(_tokenizer_templates(model_dir), _processor_template(model_dir))


def _tokenizer_templates(model_dir: Path) -> str | dict[str, str] | None:
    # transformers 5: chat_template.jinja and additional_chat_templates/*.jinja replace
    # tokenizer_config.json's "chat_template" (a string or a list of named templates).
    named = {}
    default = model_dir / "chat_template.jinja"
    if default.is_file():
        named["default"] = default.read_text(encoding="utf-8")
    extra = model_dir / "additional_chat_templates"
    if extra.is_dir():
        for path in sorted(extra.glob("*.jinja")):
            named[path.name.removesuffix(".jinja")] = path.read_text(encoding="utf-8")
    if not named:
        value = _json(model_dir / "tokenizer_config.json").get("chat_template")
        if isinstance(value, list):
            named = {t["name"]: t["template"] for t in value}
        elif isinstance(value, str):
            return value
    if list(named) == ["default"]:
        return named["default"]
    return named or None


def _processor_template(model_dir: Path) -> str | None:
    # Only models with a processor (an image/video preprocessor) get AutoProcessor's template.
    config = _json(model_dir / "processor_config.json")
    if not config and not (model_dir / "preprocessor_config.json").is_file():
        return None
    if isinstance(config.get("chat_template"), str):
        return config["chat_template"]
    legacy = _json(model_dir / "chat_template.json").get("chat_template")
    if isinstance(legacy, str):
        return legacy
    jinja_file = model_dir / "chat_template.jinja"
    return jinja_file.read_text(encoding="utf-8") if jinja_file.is_file() else None


def select_template(
    sources: TemplateSources, chat_template: str | None, tools: Sequence[Any] | None
) -> str:
    """vLLM's resolve_chat_template (without its built-in fallback templates)."""
    if chat_template is None and tools is None and sources.processor is not None:
        return sources.processor
    named = sources.tokenizer
    if isinstance(named, dict):
        if chat_template is not None:
            return named.get(chat_template, chat_template)
        if tools is not None and "tool_use" in named:
            return named["tool_use"]
        if "default" in named:
            return named["default"]
        raise ChatRequestError(
            f"the model has several chat templates and no default: {sorted(named)}"
        )
    template = chat_template if chat_template is not None else named
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


# ---------------------------------------------------------------------------------------------
# Jinja: transformers' environment plus its {% generation %} tag


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


@functools.lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    # An overlay keeps gateway.chat_template's filters and globals (tojson, raise_exception,
    # strftime_now) and adds the generation tag.
    return compile_template("").environment.overlay(extensions=[_GenerationTag])


@functools.lru_cache(maxsize=32)
def compile_chat_template(source: str) -> jinja2.Template:
    try:
        return _environment().from_string(source)
    except jinja2.TemplateError as error:
        raise ChatRequestError(f"chat template does not compile: {error}") from error


# ---------------------------------------------------------------------------------------------
# Content format: vLLM's _detect_content_format, a walk over the template's Jinja AST


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
        root = _environment().parse(template)
    except (ChatRequestError, jinja2.TemplateError):
        return "string"
    try:
        next(_content_loops(root))
    except StopIteration:
        return "string"
    except _AstShapeError:
        return "string"
    return "openai"


# ---------------------------------------------------------------------------------------------
# Special tokens (the template variables transformers adds)


def read_special_tokens(model_dir: Path) -> dict[str, str]:
    """transformers' `tokenizer.special_tokens_map`: named special tokens as strings."""
    model_dir = Path(model_dir)
    config = _json(model_dir / "tokenizer_config.json")
    values: dict[str, Any] = {k: config.get(k) for k in _SPECIAL_TOKEN_NAMES}
    extra = config.get("extra_special_tokens")
    if isinstance(extra, dict):  # model-specific named tokens, e.g. {"image_token": "<image>"}
        values.update(extra)
    if "added_tokens_decoder" not in config:
        # Legacy layout: special_tokens_map.json overrides the config's entries.
        for key, value in _json(model_dir / "special_tokens_map.json").items():
            if key in _SPECIAL_TOKEN_NAMES or (isinstance(extra, dict) and key in extra):
                values[key] = value
    return {k: s for k, v in values.items() if (s := _token_text(v)) is not None}


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):  # a serialized AddedToken
        value = value.get("content")
    return value if isinstance(value, str) else None


# ---------------------------------------------------------------------------------------------
# Messages -> the conversation the template sees (vLLM's parse_chat_messages)


@dataclass
class _Parser:
    content_format: ContentFormat
    placeholder: str | None  # None: the model takes no images
    interleave: bool  # vLLM's --interleave-mm-strings
    images: list[tuple[str, str | None]] = field(default_factory=list)

    def message(self, index: int, message: Any) -> dict[str, Any]:
        if not isinstance(message, Mapping):
            raise ChatRequestError(f"messages[{index}] must be an object")
        role = message.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise ChatRequestError(
                f"messages[{index}].role must be one of {sorted(ROLES)}, not {role!r}"
            )
        parts = _content_parts(index, message.get("content"))
        if role == "system":
            parts = _strip_billing_header(parts)
        out: dict[str, Any] = {"role": role, "content": self.content(index, parts)}
        _copy_role_fields(role, message, out)
        return out

    def content(self, index: int, parts: list[Any]) -> str | list[Any]:
        images_before = len(self.images)
        parsed = [p for j, part in enumerate(parts) if (p := self.part(index, j, part))]
        if self.content_format == "openai":
            return parsed
        count = len(self.images) - images_before
        if count == 0:
            return "\n".join(parsed)
        return _multimodal_text(index, [self.placeholder] * count, parsed, self.interleave)

    def part(self, index: int, j: int, part: Any) -> Any:
        """One content part: text, an image marker, or None (skipped)."""
        if isinstance(part, str):
            return {"type": "text", "text": part} if self.content_format == "openai" else part
        if not isinstance(part, Mapping):
            raise ChatRequestError(f"messages[{index}].content[{j}] must be a string or object")
        kind = part.get("type")
        if kind is None and "image_url" in part:
            kind = "image_url"
        if not isinstance(kind, str):
            raise ChatRequestError(f"messages[{index}].content[{j}] has no type")
        if kind in _TEXT_PARTS:
            return self.text_part(index, j, part, _TEXT_PARTS[kind])
        if kind == "image_url":
            return self.image_part(index, j, part)
        raise ChatRequestError(
            f"messages[{index}].content[{j}]: unsupported content part type {kind!r} "
            f"(this model accepts {'text and image_url' if self.placeholder else 'text'})"
        )

    def text_part(self, index: int, j: int, part: Mapping[str, Any], key: str) -> Any:
        text = part.get(key)
        if text is None:  # vLLM skips text parts without text
            return None
        if not isinstance(text, str):
            raise ChatRequestError(f"messages[{index}].content[{j}].{key} must be a string")
        if self.content_format == "openai":
            return {"type": "text", "text": text, **_extra_fields(part)}
        return text

    def image_part(self, index: int, j: int, part: Mapping[str, Any]) -> Any:
        if self.placeholder is None:
            raise ChatRequestError(
                f"messages[{index}].content[{j}]: this model does not accept images"
            )
        url, detail = part.get("image_url"), None
        if isinstance(url, Mapping):
            url, detail = url.get("url"), url.get("detail")
        if not isinstance(url, str) or not url:
            raise ChatRequestError(f"messages[{index}].content[{j}].image_url.url is required")
        self.images.append((url, detail))
        if self.content_format == "openai":
            return {"type": "image", **_extra_fields(part)}
        return _IMAGE_MARKER if self.interleave else None


def _content_parts(index: int, content: Any) -> list[Any]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return content
    raise ChatRequestError(f"messages[{index}].content must be a string, a list or null")


def _strip_billing_header(parts: list[Any]) -> list[Any]:
    # vLLM drops Claude Code's per-request attribution line from system text so the prompt
    # prefix stays cacheable.
    out = []
    for part in parts:
        text = part if isinstance(part, str) else None
        if isinstance(part, Mapping) and part.get("type") == "text":
            text = part.get("text")
        if not (isinstance(text, str) and text.startswith(_BILLING_HEADER)):
            out.append(part)
            continue
        rest = text.partition("\n")[2]
        if rest:
            out.append(rest if isinstance(part, str) else {**part, "text": rest})
    return out


def _extra_fields(part: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in part.items() if k not in _KNOWN_PART_FIELDS}


def _multimodal_text(
    index: int, placeholders: list[str], texts: list[str], interleave: bool
) -> str:
    """vLLM's _get_full_multimodal_text_prompt for one message's images and texts."""
    if interleave:
        # Image parts left a marker where they were; each takes the next placeholder.
        slots = list(placeholders)
        if texts.count(_IMAGE_MARKER) > len(slots):
            raise ChatRequestError(f"messages[{index}] has more {_IMAGE_MARKER!r} than images")
        texts = [slots.pop(0) if t == _IMAGE_MARKER else t for t in texts]
    text = "\n".join(texts)
    missing: list[str] = []
    for placeholder, count in Counter(placeholders).items():
        # Placeholders the user already wrote into the text stand for images.
        count -= text.count(placeholder)
        if count < 0:
            raise ChatRequestError(
                f"messages[{index}] has more {placeholder!r} placeholders than images"
            )
        missing += [placeholder] * count
    return "\n".join([*missing, text] if text else missing)


def _copy_role_fields(role: str, message: Mapping[str, Any], out: dict[str, Any]) -> None:
    if role == "assistant":
        if message.get("tool_calls") is not None:
            out["tool_calls"] = list(message["tool_calls"])
        if message.get("reasoning") is not None:
            out["reasoning"] = out["reasoning_content"] = message["reasoning"]
    elif role == "tool":
        if "tool_call_id" in message:
            out["tool_call_id"] = message["tool_call_id"]
        if isinstance(out["content"], list):
            out["content"] = _tool_text(out["content"])
    if isinstance(message.get("name"), str):
        out["name"] = message["name"]
    if isinstance(message.get("task"), str):
        out["task"] = message["task"]
    if role == "developer":
        out["tools"] = message.get("tools")


def _tool_text(parts: list[Any]) -> str | list[Any]:
    # Most templates print a tool result as a string; vLLM joins all-text lists.
    if any(isinstance(p, dict) and p.get("type") != "text" for p in parts):
        return parts
    return "\n".join(p.get("text", "") for p in parts if isinstance(p, dict))


def _postprocess_tool_calls(conversation: list[dict[str, Any]]) -> None:
    """Assistant tool-call arguments become dicts, as tool-use templates expect."""
    for message in conversation:
        calls = message.get("tool_calls")
        if message["role"] != "assistant" or not isinstance(calls, list):
            continue
        if not calls:
            message.pop("tool_calls")  # keeps templates on the plain assistant path
            continue
        message["tool_calls"] = [_tool_call(call) for call in calls]


def _tool_call(call: Any) -> dict[str, Any]:
    if not isinstance(call, Mapping):
        raise ChatRequestError("assistant tool_calls entries must be objects")
    function = call.get("function")
    if call.get("type", "function") != "function" or not isinstance(function, Mapping):
        raise ChatRequestError("assistant tool_calls must be of type function")
    # Key order as the server's pydantic validation leaves it (id, function, type; arguments,
    # name), which a template printing a whole tool call with tojson shows.
    function = _ordered(function, ("arguments", "name"))
    function["arguments"] = _arguments(function.get("arguments"))
    return _ordered({**call, "function": function}, ("id", "function", "type"))


def _arguments(value: Any) -> dict[str, Any]:
    if not value:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return {}  # history with broken arguments must not fail every later turn
    return value if isinstance(value, dict) else {}


def _ordered(mapping: Mapping[str, Any], first: Sequence[str]) -> dict[str, Any]:
    out = {k: mapping[k] for k in first if k in mapping}
    out.update((k, v) for k, v in mapping.items() if k not in out)
    return out


def _developer_as_system(conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For templates without a developer role: developer -> system, all systems merged first."""
    converted = []
    for message in conversation:
        if message["role"] == "developer":
            message = {k: v for k, v in message.items() if k != "tools"}
            message["role"] = "system"
        converted.append(message)
    systems, others, merge = [], [], False
    for i, message in enumerate(converted):
        if message["role"] != "system":
            others.append(message)
            continue
        merge = merge or i > 0 or bool(systems)
        if text := _system_text(message.get("content", "")):
            systems.append(text)
    if not merge:
        return converted
    return [{"role": "system", "content": "\n\n".join(systems)}, *others]


def _system_text(content: Any) -> Any:
    if not isinstance(content, list):
        return content
    texts = [p["text"] if isinstance(p, dict) else p for p in content if _has_text(p)]
    return "\n".join(texts)


def _has_text(part: Any) -> bool:
    return isinstance(part, str) or isinstance(part, dict) and "text" in part


def normalize_tools(tools: Sequence[Any]) -> list[dict[str, Any]]:
    """Tools as the server's ChatCompletionToolsParam.model_dump() gives them to the template."""
    if not isinstance(tools, list):
        raise ChatRequestError("tools must be a list")
    return [_tool(i, tool) for i, tool in enumerate(tools)]


def _tool(index: int, tool: Any) -> dict[str, Any]:
    if not isinstance(tool, Mapping):
        raise ChatRequestError(f"tools[{index}] must be an object")
    function = tool.get("function")
    if tool.get("type", "function") != "function" or not isinstance(function, Mapping):
        raise ChatRequestError(f"tools[{index}] must be a function tool")
    if not isinstance(function.get("name"), str):
        raise ChatRequestError(f"tools[{index}].function.name must be a string")
    # Exactly these keys, in this order: templates print tools with tojson.
    out = {
        "name": function["name"],
        "description": function.get("description"),
        "parameters": function.get("parameters"),
    }
    if function.get("strict") is not None:
        out["strict"] = function["strict"]
    defer = function.get("defer_loading", tool.get("defer_loading"))
    if defer is not None:
        out["defer_loading"] = defer
    dumped: dict[str, Any] = {"type": "function", "function": out}
    if tool.get("defer_loading") is not None:
        dumped["defer_loading"] = tool["defer_loading"]
    return dumped


# ---------------------------------------------------------------------------------------------
# The renderer


class ChatRenderer:
    def __init__(
        self,
        tokenizer: Tokenizer,
        templates: TemplateSources,
        special_tokens: Mapping[str, str],
        *,
        image_placeholder: str | None = None,
        chat_template: str | None = None,
        content_format: Literal["auto", "string", "openai"] = "auto",
        interleave_mm_strings: bool = False,
    ) -> None:
        self.tokenizer = tokenizer
        self.templates = templates
        self.special_tokens = dict(special_tokens)
        self.image_placeholder = image_placeholder
        self.chat_template = chat_template
        self.content_format = content_format
        self.interleave_mm_strings = interleave_mm_strings

    @classmethod
    def from_model_dir(
        cls,
        model_dir: Path,
        chat_template: str | None = None,
        *,
        content_format: Literal["auto", "string", "openai"] = "auto",
        interleave_mm_strings: bool = False,
    ) -> ChatRenderer:
        """`chat_template` is template text or a name of one of the tokenizer's templates."""
        model_dir = Path(model_dir)
        renderer = cls(
            Tokenizer.from_file(str(model_dir / "tokenizer.json")),
            read_template_sources(model_dir),
            read_special_tokens(model_dir),
            image_placeholder=_image_placeholder(model_dir),
            chat_template=chat_template,
            content_format=content_format,
            interleave_mm_strings=interleave_mm_strings,
        )
        if chat_template is not None:
            # A broken --chat-template is the operator's mistake: fail at startup.
            compile_chat_template(select_template(renderer.templates, chat_template, None))
        return renderer

    @property
    def accepts_images(self) -> bool:
        return self.image_placeholder is not None

    def render(
        self,
        messages: list[dict],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: list[dict] | None = None,
        chat_template_kwargs: dict | None = None,
        add_special_tokens: bool = False,
    ) -> RenderedChat:
        kwargs = _template_kwargs(chat_template_kwargs)
        tools_value = kwargs.pop("tools", normalize_tools(tools) if tools is not None else None)
        documents = kwargs.pop("documents", None)
        if continue_final_message and add_generation_prompt:
            raise ChatRequestError(
                "continue_final_message and add_generation_prompt cannot both be true"
            )
        template = select_template(self.templates, self.chat_template, tools_value)
        conversation, images = self._conversation(messages, template)
        prompt = _apply_template(
            template,
            conversation,
            variables={**self.special_tokens, **kwargs},
            tools=tools_value,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
        )
        ids = self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens).ids
        return RenderedChat(prompt=prompt, token_ids=ids, image_urls=images)

    def _conversation(
        self, messages: list[dict], template: str
    ) -> tuple[list[dict[str, Any]], list[tuple[str, str | None]]]:
        if not isinstance(messages, list) or not messages:
            raise ChatRequestError("messages must be a non-empty list")
        fmt = self.content_format
        parser = _Parser(
            content_format=detect_content_format(template) if fmt == "auto" else fmt,
            placeholder=self.image_placeholder,
            interleave=self.interleave_mm_strings,
        )
        # Deep copies: post-processing rewrites tool calls, the caller's dicts stay intact.
        conversation = [parser.message(i, copy.deepcopy(m)) for i, m in enumerate(messages)]
        _postprocess_tool_calls(conversation)
        if any(m["role"] == "developer" for m in conversation) and not _knows_developer(template):
            conversation = _developer_as_system(conversation)
        return conversation, parser.images


def _template_kwargs(chat_template_kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, Mapping):
        raise ChatRequestError("chat_template_kwargs must be an object")
    kwargs = dict(chat_template_kwargs or {})
    if refused := sorted(_REFUSED_KWARGS & kwargs.keys()):
        raise ChatRequestError(f"chat_template_kwargs may not set {', '.join(refused)}")
    # The request's own add_generation_prompt/continue_final_message win over the kwargs.
    ignored = _IGNORED_KWARGS | {"add_generation_prompt", "continue_final_message"}
    return {k: v for k, v in kwargs.items() if k not in ignored and not _unset(v)}


def _unset(value: Any) -> bool:
    # vLLM merges request kwargs over its defaults with merge_kwargs, which drops these.
    return value is None or (isinstance(value, str) and value == "auto")


@functools.lru_cache(maxsize=32)
def _knows_developer(template: str) -> bool:
    return '"developer"' in template or "'developer'" in template


def _apply_template(
    template: str,
    conversation: list[dict[str, Any]],
    *,
    variables: dict[str, Any],
    tools: Any,
    documents: Any,
    add_generation_prompt: bool,
    continue_final_message: bool,
) -> str:
    """transformers' render_jinja_template for one conversation, tokenize=False."""
    if documents is not None and not all(isinstance(d, dict) for d in documents):
        raise ChatRequestError("documents must be a list of objects")
    final_text = None
    if continue_final_message:
        final_text = _tag_final_message(conversation, template)
    compiled = compile_chat_template(template)
    try:
        prompt = compiled.render(
            messages=conversation,
            tools=tools,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            **variables,
        )
    except Exception as error:  # vLLM answers any template failure with a 400 and its reason
        raise ChatRequestError(f"chat template: {error}") from error
    if final_text is None:
        return prompt
    return _cut_at_tag(prompt, final_text)


def _tag_final_message(conversation: list[dict[str, Any]], template: str) -> str:
    """Marks the end of the final message's (last) text so the prompt can be cut there."""
    final = conversation[-1]
    content = final.get("content")
    if content is None:
        raise ChatRequestError('continue_final_message: the final message has no "content"')
    if "content" not in template:
        raise ChatRequestError("continue_final_message: the chat template has no content field")
    if isinstance(content, list):
        for part in reversed(content):
            if "text" in part:
                text = part["text"]
                part["text"] = text + _CONTINUE_TAG
                return text
        raise ChatRequestError("continue_final_message: the final message has no text")
    final["content"] = content + _CONTINUE_TAG
    return content


def _cut_at_tag(prompt: str, final_text: str) -> str:
    tag = _CONTINUE_TAG.strip()
    if final_text.strip() not in prompt or tag not in prompt:
        raise ChatRequestError(
            "continue_final_message: the chat template does not render the final message"
        )
    at = prompt.rindex(tag)
    if prompt[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return prompt[:at]
    return prompt[:at].rstrip()  # the template trimmed the message's trailing space


def _image_placeholder(model_dir: Path) -> str | None:
    try:
        return processor_for(model_dir).placeholder_text
    except UnsupportedModel:
        return None  # text-only model


def _json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
