"""Request messages to the conversation a chat template sees: vLLM's `parse_chat_messages`.

- Content: in the "openai" format parts become `{"type": "text", ...}` / `{"type": "image"}`
  (`"video"`, `"audio"`; with any extra keys of the part); in the "string" format text parts
  are joined with "\\n" and one placeholder per media item is *prepended* (joined with "\\n")
  unless the text already holds it. The placeholder text is what vLLM's model class returns from
  `get_placeholder_str` (e.g. Qwen2-VL's `<|vision_start|><|image_pad|><|vision_end|>`); it
  comes from the model's multimodal processor, which mirrors it per family.
- Post-processing: assistant tool-call arguments (JSON strings) become dicts, tool content
  lists become strings, and `developer` becomes `system` (all system messages merged first)
  when the template does not know the developer role.
- Tools as the server's `ChatCompletionToolsParam.model_dump()` gives them to the template.

Media items come out in prompt order, which is the order the placeholders are expanded in.
"""

from __future__ import annotations

import copy
import functools
import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import ChatRequestError
from gateway.render.content_format import ContentFormat
from multimodal.processors.base import Modality

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
# vLLM's MODALITY_PLACEHOLDERS_MAP: with --interleave-mm-strings a media part leaves its
# modality's marker in the text, and each marker takes that modality's next placeholder.
_MARKERS: dict[str, str] = {"image": "<##IMAGE##>", "video": "<##VIDEO##>", "audio": "<##AUDIO##>"}
# Media part type -> its modality (vLLM's MM_PARSER_MAP), checked in this order for a part
# without a type (vLLM's `_parse_chat_message_content_mm_part`).
_MEDIA_PARTS: dict[str, Modality] = {
    "image_url": "image",
    "audio_url": "audio",
    "input_audio": "audio",
    "video_url": "video",
}
_PLURAL = {"image": "images", "video": "videos", "audio": "audio"}
_BILLING_HEADER = "x-anthropic-billing-header"


@dataclass(frozen=True)
class MediaItem:
    """A media part of the request, in prompt order."""

    modality: Modality
    url: str
    detail: str | None = None
    # Where it was, e.g. "messages[0].content[1]", for errors naming the part.
    part: str = field(default="", compare=False)


def to_conversation(
    messages: list[dict],
    template: str,
    content_format: ContentFormat,
    placeholders: Mapping[Modality, Placeholder],
    interleave: bool = False,
) -> tuple[list[dict[str, Any]], list[MediaItem]]:
    """The messages as `template` sees them, and their media items in prompt order.
    `placeholders`: the string-format placeholder of each modality the model takes."""
    if not isinstance(messages, list) or not messages:
        raise ChatRequestError("messages must be a non-empty list")
    parser = _Parser(content_format, dict(placeholders), interleave)
    # Deep copies: post-processing rewrites tool calls, the caller's dicts stay intact.
    conversation = [parser.message(i, copy.deepcopy(m)) for i, m in enumerate(messages)]
    _postprocess_tool_calls(conversation)
    if any(m["role"] == "developer" for m in conversation) and not _knows_developer(template):
        conversation = _developer_as_system(conversation)
    return conversation, parser.media


@functools.lru_cache(maxsize=32)
def _knows_developer(template: str) -> bool:
    return '"developer"' in template or "'developer'" in template


# What vLLM writes for a media item in a "string"-format prompt: a text, or a function of the
# item's index among its modality's (from 1) giving one; None: nothing.
Placeholder = str | Callable[[int], str | None] | None


@dataclass
class _Parser:
    content_format: ContentFormat
    placeholders: dict[Modality, Placeholder]  # empty: the model takes no media
    interleave: bool  # vLLM's --interleave-mm-strings
    media: list[MediaItem] = field(default_factory=list)

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
        media_before = len(self.media)
        parsed = [p for j, part in enumerate(parts) if (p := self.part(index, j, part))]
        if self.content_format == "openai":
            return parsed
        if len(self.media) == media_before:
            return "\n".join(parsed)
        items = range(media_before, len(self.media))
        texts = [(self.media[k].modality, self._placeholder(k)) for k in items]
        placeholders = [(m, text) for m, text in texts if text]  # vLLM writes nothing for None
        return _multimodal_text(index, placeholders, parsed, self.interleave)

    def _placeholder(self, k: int) -> str | None:
        """The text for the k-th media item, which is the n-th of its modality (from 1)."""
        modality = self.media[k].modality
        placeholder = self.placeholders[modality]
        if not callable(placeholder):
            return placeholder
        return placeholder(sum(item.modality == modality for item in self.media[: k + 1]))

    def part(self, index: int, j: int, part: Any) -> Any:
        """One content part: text, an image marker, or None (skipped)."""
        if isinstance(part, str):
            return {"type": "text", "text": part} if self.content_format == "openai" else part
        if not isinstance(part, Mapping):
            raise ChatRequestError(f"messages[{index}].content[{j}] must be a string or object")
        kind = part.get("type")
        if kind is None:
            kind = next((name for name in _MEDIA_PARTS if name in part), None)
        if not isinstance(kind, str):
            raise ChatRequestError(f"messages[{index}].content[{j}] has no type")
        if kind in _TEXT_PARTS:
            return self.text_part(index, j, part, _TEXT_PARTS[kind])
        if kind in _MEDIA_PARTS:
            return self.media_part(index, j, part, kind)
        accepted = ["text"] + [n for n, m in _MEDIA_PARTS.items() if m in self.placeholders]
        raise ChatRequestError(
            f"messages[{index}].content[{j}]: unsupported content part type {kind!r} "
            f"(this model accepts {', '.join(accepted)})"
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

    def media_part(self, index: int, j: int, part: Mapping[str, Any], kind: str) -> Any:
        """An `image_url`, `video_url`, `audio_url` or `input_audio` part: its item, and what
        the template sees."""
        modality = _MEDIA_PARTS[kind]
        where = f"messages[{index}].content[{j}]"
        if modality not in self.placeholders:
            raise ChatRequestError(
                f"{where}: this model does not accept {_PLURAL[modality]} ({kind})"
            )
        if kind == "input_audio":
            url, detail = _input_audio_url(where, part.get(kind)), None
        else:
            url, detail = part.get(kind), None
            if isinstance(url, Mapping):
                url, detail = url.get("url"), url.get("detail")
            if not isinstance(url, str) or not url:
                raise ChatRequestError(f"{where}.{kind}.url is required")
        self.media.append(MediaItem(modality, url, detail if modality == "image" else None, where))
        if self.content_format == "openai":
            return {"type": modality, **_extra_fields(part)}
        return _MARKERS[modality] if self.interleave else None


def _input_audio_url(where: str, value: Any) -> str:
    """The URL vLLM makes of an `input_audio` part: `data:audio/<format>;base64,<data>`. Its
    loader ignores the media type (the bytes are sniffed), so any `format` goes; vLLM's
    request model takes only "wav" and "mp3" (OpenAI's), which the gateway does not hold to."""
    if not isinstance(value, Mapping):
        raise ChatRequestError(f"{where}.input_audio must be an object with data and format")
    data, audio_format = value.get("data"), value.get("format", "")
    if not isinstance(data, str) or not data:
        raise ChatRequestError(f"{where}.input_audio.data is required (base64 audio)")
    if not isinstance(audio_format, str):
        raise ChatRequestError(f"{where}.input_audio.format must be a string")
    return f"data:audio/{audio_format};base64,{data}"


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
    index: int, placeholders: list[tuple[Modality, str]], texts: list[str], interleave: bool
) -> str:
    """vLLM's _get_full_multimodal_text_prompt for one message's media and texts
    (`placeholders`: each item's modality and text, in part order)."""
    if interleave:
        texts = _interleaved(index, placeholders, texts)
    text = "\n".join(texts)
    missing: list[str] = []
    # vLLM counts the placeholders grouped by modality, in the order modalities first appear.
    first = {m: k for k, (m, _) in reversed(list(enumerate(placeholders)))}
    ordered = sorted(placeholders, key=lambda pair: first[pair[0]])
    for placeholder, count in Counter(text for _, text in ordered).items():
        # Placeholders the user already wrote into the text stand for images.
        count -= text.count(placeholder)
        if count < 0:
            raise ChatRequestError(
                f"messages[{index}] has more {placeholder!r} placeholders than images"
            )
        missing += [placeholder] * count
    return "\n".join([*missing, text] if text else missing)


def _interleaved(
    index: int, placeholders: list[tuple[Modality, str]], texts: list[str]
) -> list[str]:
    """Media parts left their modality's marker where they were; each marker takes the next
    placeholder of that modality."""
    slots = {m: [t for modality, t in placeholders if modality == m] for m in _MARKERS}
    modality_of = {marker: m for m, marker in _MARKERS.items()}
    out = []
    for text in texts:
        if (modality := modality_of.get(text)) is not None:
            if not slots[modality]:
                raise ChatRequestError(f"messages[{index}] has more {text!r} than {modality}s")
            text = slots[modality].pop(0)
        out.append(text)
    return out


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
