"""What one request may hold: body size, JSON nesting, messages, parts, images, stop strings.

Each bounds the memory or work a single request can demand before anything is fetched,
rendered or sent to a worker, and each is refused with a 400 (413 for the body) whose message
names the limit and the flag that changes it. vLLM has none of these; OpenAI's API has its own
(e.g. 4 stop strings), which would refuse requests vLLM takes, so the defaults are generous.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.errors import GatewayError

MIB = 1 << 20


@dataclass(frozen=True)
class RequestLimits:
    max_body_bytes: int = 64 * MIB  # images travel inline as data: URIs
    max_json_depth: int = 64  # tool and response schemas nest; chat bodies are ~6 deep
    max_messages: int = 4096
    max_content_parts: int = 1024  # per message
    max_images: int = 64  # per request, before any is fetched
    max_stop_strings: int = 64

    def body_too_large(self) -> GatewayError:
        return GatewayError(
            f"the request body is larger than {self.max_body_bytes} bytes "
            f"(--max-request-body-bytes)",
            413,
        )

    def check_depth(self, value: Any) -> None:
        """Refuse JSON nested deeper than `max_json_depth` (objects and arrays)."""
        if json_depth(value, self.max_json_depth) > self.max_json_depth:
            raise GatewayError(self.depth_message(), 400)

    def depth_message(self) -> str:
        return (
            f"the request body's JSON is nested deeper than {self.max_json_depth} levels "
            "(--max-json-depth)"
        )

    def check_messages(self, messages: Sequence[Any]) -> None:
        """Messages, parts per message and images per request."""
        if len(messages) > self.max_messages:
            raise GatewayError(
                f"the request has {len(messages)} messages; at most {self.max_messages} "
                "are accepted (--max-messages)",
                400,
                "messages",
            )
        images = 0
        for index, message in enumerate(messages):
            content = message.get("content") if isinstance(message, Mapping) else None
            if not isinstance(content, list):
                continue
            if len(content) > self.max_content_parts:
                raise GatewayError(
                    f"messages[{index}] has {len(content)} content parts; at most "
                    f"{self.max_content_parts} are accepted (--max-content-parts)",
                    400,
                    f"messages[{index}].content",
                )
            images += sum(_is_image(part) for part in content)
        if images > self.max_images:
            raise GatewayError(
                f"the request has {images} images; at most {self.max_images} are accepted "
                "(--max-images-per-request)",
                400,
                "messages",
            )

    def check_body(self, body: Any) -> None:
        """The counted limits, on a parsed body before it is validated (cheaper to refuse
        100,000 messages before pydantic builds them)."""
        if not isinstance(body, Mapping):
            return
        if isinstance(messages := body.get("messages"), list):
            self.check_messages(messages)
        if isinstance(stop := body.get("stop"), list):
            self.check_stop(stop)

    def check_stop(self, stop: Sequence[Any]) -> None:
        if len(stop) > self.max_stop_strings:
            raise GatewayError(
                f"the request has {len(stop)} stop strings; at most {self.max_stop_strings} "
                "are accepted (--max-stop-strings)",
                400,
                "stop",
            )


def json_depth(value: Any, cap: int) -> int:
    """The nesting depth of parsed JSON (a scalar is 0, `[]` is 1), counted no further than
    one past `cap`. Iterative: a deep body must not exhaust Python's stack here."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > cap:
            return deepest
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return deepest


def _is_image(part: Any) -> bool:
    return isinstance(part, Mapping) and (
        part.get("type") in ("image_url", "image") or "image_url" in part
    )
