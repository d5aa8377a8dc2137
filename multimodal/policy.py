"""Operator limits for loading media (``MediaPolicy``) and the size-limit error they imply."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field, replace
from pathlib import Path

from PIL import Image

from multimodal.errors import MediaTooLargeError

__all__ = ["DEFAULT_IMAGE_FORMATS", "IPAddress", "IPNetwork", "MediaPolicy", "byte_limit_error"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# Still-image formats whose Pillow decoders are in-process and widely exercised. vLLM accepts a
# much longer list (TIFF, PSD, ICO, ...); every extra parser is attack surface that OpenAI-style
# clients do not need, so operators must opt in via ``MediaPolicy.allowed_formats``.
DEFAULT_IMAGE_FORMATS: tuple[str, ...] = ("JPEG", "PNG", "WEBP", "GIF", "BMP")

_MiB = 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class MediaPolicy:
    """Operator limits for loading media. Field names follow vLLM's flags where one exists.

    - ``allowed_domains`` <- ``--allowed-media-domains``: when non-empty, an HTTP(S) URL's
      hostname (and every redirect's) must equal one of these exactly, as in vLLM. ``None`` or
      empty means any public host.
    - ``allowed_networks``: CIDRs the operator trusts even though they are not globally
      routable (e.g. ``"10.0.0.0/8"``, ``"127.0.0.1/32"``). Without them, loopback, private,
      link-local, CGNAT, multicast, unspecified and reserved addresses are refused. A cloud
      metadata address is only reachable if listed as a single address (``/32`` or ``/128``).
    - ``local_root`` <- ``--allowed-local-media-path``: ``file://`` URLs may read files under
      this directory; ``None`` refuses ``file://`` entirely.
    - ``max_video_bytes``: the encoded size of one video (a container, or all the frames of
      a ``data:video/jpeg`` frame list); ``max_bytes`` is the image's.
    - ``max_video_frames`` / ``max_video_seconds``: a clip's frame count and length as its
      container states them (checked before any frame is decoded: decoding reads every
      frame up to the last one picked, so the cost grows with the clip, not the picks).
    - ``video_decode_timeout``: seconds the gateway may spend decoding one clip's frames.
    - ``max_video_decoded_bytes``: the RGB bytes of the frames the gateway keeps of one clip
      (picked frames x height x width x 3), checked after picking and before decoding: with
      ``--max-concurrent-videos`` it bounds the gateway's memory for videos.
    - ``max_audio_bytes`` / ``max_audio_seconds`` / ``max_audio_decoded_bytes``: one audio
      clip's encoded size, length and decoded float32 PCM (channels x samples x 4), vLLM's
      ``VLLM_MAX_AUDIO_CLIP_FILESIZE_MB`` (25), ``VLLM_MAX_AUDIO_DECODE_DURATION_S`` (600) and
      ``VLLM_MAX_AUDIO_DECODE_BYTES`` (256 MiB) by default; checked from the header before
      decoding and on the decoded samples after.
    - ``max_audio_sample_rate`` / ``max_audio_channels``: limits vLLM does not have. A model
      takes 16 kHz mono; a clip far above that costs resampling and decoding for nothing.
    - ``audio_decode_timeout``: seconds the gateway may spend decoding one clip.
    - ``max_pixels`` (per image, and per video frame) must stay at or below Pillow's
      ``MAX_IMAGE_PIXELS`` so any image we accept decodes without Pillow's own bomb warning.
    """

    allowed_domains: tuple[str, ...] | None = None
    allowed_networks: tuple[str, ...] = ()
    local_root: Path | None = None
    max_bytes: int = 20 * _MiB
    max_video_bytes: int = 64 * _MiB
    max_video_frames: int = 18_000  # ten minutes at 30 fps
    max_video_seconds: float = 600.0
    video_decode_timeout: float = 30.0
    max_video_decoded_bytes: int = 1024 * _MiB
    max_audio_bytes: int = 25 * _MiB
    max_audio_seconds: float = 600.0
    max_audio_decoded_bytes: int = 256 * _MiB
    max_audio_sample_rate: int = 192_000
    max_audio_channels: int = 8
    audio_decode_timeout: float = 30.0
    max_pixels: int = 64_000_000
    connect_timeout: float = 5.0
    read_timeout: float = 10.0
    total_timeout: float = 30.0
    max_redirects: int = 3
    allowed_formats: tuple[str, ...] = DEFAULT_IMAGE_FORMATS
    # What ``max_bytes`` applies to, for error messages: "video" in ``for_video``'s copy,
    # "audio" in ``for_audio``'s.
    media_kind: str = "image"

    # Parsed forms of ``allowed_networks``, read by ``multimodal.net_guard``.
    _networks: tuple[IPNetwork, ...] = field(init=False, repr=False, compare=False)
    _allowed_hosts: frozenset[IPAddress] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._normalize_lists()
        if self.local_root is not None:
            self._resolve_local_root(self.local_root)
        self._check_limits()

    def for_video(self) -> MediaPolicy:
        """The policy for loading one video: its bytes limited by ``max_video_bytes``."""
        return replace(self, max_bytes=self.max_video_bytes, media_kind="video")

    def for_audio(self) -> MediaPolicy:
        """The policy for loading one audio clip: its bytes limited by ``max_audio_bytes``."""
        return replace(self, max_bytes=self.max_audio_bytes, media_kind="audio")

    def _normalize_lists(self) -> None:
        # Frozen, so normalized values are written with object.__setattr__.
        domains = tuple(d.strip().lower() for d in self.allowed_domains or ())
        object.__setattr__(self, "allowed_domains", domains or None)
        try:
            networks = tuple(ipaddress.ip_network(n, strict=False) for n in self.allowed_networks)
        except ValueError as exc:
            raise ValueError(f"invalid allowed_networks entry: {exc}") from None
        object.__setattr__(self, "allowed_networks", tuple(str(n) for n in networks))
        object.__setattr__(self, "_networks", networks)
        hosts = frozenset(n.network_address for n in networks if n.num_addresses == 1)
        object.__setattr__(self, "_allowed_hosts", hosts)
        object.__setattr__(self, "allowed_formats", tuple(f.upper() for f in self.allowed_formats))

    def _resolve_local_root(self, local_root: Path) -> None:
        # Resolved once so containment checks compare canonical paths, as vLLM does.
        root = Path(local_root).resolve()
        if not root.is_dir():
            raise ValueError(f"local media root {root} is not an existing directory")
        object.__setattr__(self, "local_root", root)

    def _check_limits(self) -> None:
        for name in (
            "max_bytes",
            "max_video_bytes",
            "max_video_frames",
            "max_video_seconds",
            "video_decode_timeout",
            "max_video_decoded_bytes",
            "max_audio_bytes",
            "max_audio_seconds",
            "max_audio_decoded_bytes",
            "max_audio_sample_rate",
            "max_audio_channels",
            "audio_decode_timeout",
            "max_pixels",
            "connect_timeout",
            "read_timeout",
            "total_timeout",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.max_redirects < 0:
            raise ValueError("max_redirects must be >= 0")
        pillow_limit = Image.MAX_IMAGE_PIXELS
        if pillow_limit is not None and self.max_pixels > pillow_limit:
            raise ValueError(
                f"max_pixels {self.max_pixels} exceeds Pillow's MAX_IMAGE_PIXELS {pillow_limit}"
            )
        if not self.allowed_formats:
            raise ValueError("allowed_formats must not be empty")


def byte_limit_error(max_bytes: int, kind: str = "image") -> MediaTooLargeError:
    """The error for encoded bytes beyond ``max_bytes``, worded the same for every source."""
    size = f"{max_bytes / _MiB:g} MiB" if max_bytes >= _MiB else f"{max_bytes} bytes"
    return MediaTooLargeError(f"{kind} exceeds the {size} size limit", kind=kind)
