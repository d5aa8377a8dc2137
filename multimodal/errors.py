"""The one error root, `MmgateError`, and the typed failures of media loading.

`MmgateError` is what mmgate raises on purpose: bad input from a client, a model or setting it
cannot serve, a worker that misbehaved. It carries what the client is told: `status` (an HTTP
status: 4xx the caller's fault, 5xx ours or a worker's) and `param` (the request field at
fault). `gateway.errors` turns any of them into an OpenAI-style response, in one place, so no
code path catches one kind to re-raise it as another. The root lives here, in the lowest
package the gateway builds on, so that multimodal needs nothing from the gateway.

Every way a client-supplied image can be refused maps to a `MediaError`, answered with a 400
that names the image and the reason. Its messages are written for the API client: they never
contain resolved IP addresses or paths outside the operator's media root, which would leak
internal topology.
"""

from __future__ import annotations

from typing import ClassVar


class MmgateError(Exception):
    """Root of mmgate's errors; `status` and `param` default to the class's own."""

    status: int = 400
    param: str | None = None

    def __init__(self, message: str, status: int | None = None, param: str | None = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status
        if param is not None:
            self.param = param

    @property
    def message(self) -> str:
        """What the client reads."""
        return str(self)


class MediaError(MmgateError):
    """Base class: ``reason`` is the client-facing explanation, ``index`` the item's position
    among the request's items of its ``kind`` ("image" or "video").

    ``index`` is ``None`` until a caller that knows the position (``load_images`` or the
    gateway) sets it; ``str()`` then reads ``"image 2: <reason>"``.
    """

    # Stable, short identifier for metrics and structured error bodies.
    code: ClassVar[str] = "media_error"
    param = "messages"

    def __init__(self, reason: str, *, index: int | None = None, kind: str = "image") -> None:
        super().__init__(reason)
        self.reason = reason
        self.index = index
        self.kind = kind

    def __str__(self) -> str:
        if self.index is None:
            return self.reason
        return f"{self.kind} {self.index}: {self.reason}"

    @property
    def message(self) -> str:
        return f"invalid {self.kind}: {self}"


class MediaSourceError(MediaError):
    """The source string itself is unusable: unknown scheme, malformed URL or data URI."""

    code = "invalid_source"


class MediaForbiddenError(MediaError):
    """The operator's policy refuses the source (address, domain, local path, redirect)."""

    code = "forbidden"


class MediaFetchError(MediaError):
    """The source was allowed but could not be retrieved (HTTP error, connection failure)."""

    code = "fetch_failed"


class MediaTimeoutError(MediaFetchError):
    """Retrieval exceeded a connect, read or total time limit."""

    code = "timeout"


class MediaTooLargeError(MediaError):
    """The encoded bytes or the decoded pixel count exceed the policy limits."""

    code = "too_large"


class MediaDecodeError(MediaError):
    """The bytes are not a supported, intact image."""

    code = "decode_failed"


__all__ = [
    "MediaDecodeError",
    "MediaError",
    "MediaFetchError",
    "MediaForbiddenError",
    "MediaSourceError",
    "MediaTimeoutError",
    "MediaTooLargeError",
    "MmgateError",
]
