"""Typed failures of media loading.

Every way a client-supplied image can be refused maps to one of these, so the gateway can answer
with an HTTP 400 that names the offending image and the reason instead of a 500. Messages are
written for the API client: they never contain resolved IP addresses or paths outside the
operator's media root, which would leak internal topology.
"""

from __future__ import annotations

from typing import ClassVar


class MediaError(Exception):
    """Base class: ``reason`` is the client-facing explanation, ``index`` the image position.

    ``index`` is ``None`` until a caller that knows the position (``load_images`` or the
    gateway) sets it; ``str()`` then reads ``"image 2: <reason>"``.
    """

    # Stable, short identifier for metrics and structured error bodies.
    code: ClassVar[str] = "media_error"

    def __init__(self, reason: str, *, index: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.index = index

    def __str__(self) -> str:
        if self.index is None:
            return self.reason
        return f"image {self.index}: {self.reason}"


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
]
