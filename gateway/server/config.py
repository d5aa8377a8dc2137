"""What `mmgate serve` is told: the model, the workers, and the server's limits and policies."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gateway.api.responses.memory_store import StoreLimits
from gateway.parsers.config import ParsingConfig
from gateway.ratelimit.policy import RateLimits
from gateway.render.worker_media import MmProcessing
from gateway.server.access import MetricsAuth, Surfaces
from gateway.server.limits import RequestLimits
from gateway.workers.pool import PoolOptions
from gateway.workers.tensor_transport import DEFAULT_SHM_MIN_BYTES, TensorTransportMode
from multimodal.media import MediaPolicy


@dataclass
class CorsConfig:
    """vLLM's --allowed-origins/methods/headers and --allow-credentials; no origins by default."""

    allowed_origins: list[str] = field(default_factory=list)
    allowed_methods: list[str] = field(default_factory=lambda: ["*"])
    allowed_headers: list[str] = field(default_factory=lambda: ["*"])
    allow_credentials: bool = False


@dataclass
class AdmissionConfig:
    """At most max_in_flight generation requests at once, max_queue waiting (429 beyond),
    each waiting at most queue_timeout seconds (503 after)."""

    max_in_flight: int = 256
    max_queue: int = 1024
    queue_timeout: float = 30.0


@dataclass(repr=False)
class GatewayConfig:
    model: Path  # a local model directory, or a name whose files come from the workers
    workers: list[str]
    served_model_name: str | None = None
    chat_template: str | None = None
    media_policy: MediaPolicy = field(default_factory=MediaPolicy)
    max_concurrent_videos: int | None = None  # videos preprocessed at once; None: half the cores
    max_mm_message_bytes: int = (1 << 31) - 1  # a request's tensors on the wire (gRPC's cap)
    trust_request_mm_kwargs: bool = False  # vLLM's: per-request media_io_kwargs allowed
    # Preprocessed items kept per process (multimodal.media_cache); 0: none. vLLM's default:
    # a chat resending 2 Qwen3-VL images (640x480, 1280x960: 37 MB of float32) keeps ~100.
    mm_processor_cache_gb: float = 4.0
    mm_processing: MmProcessing = "auto"
    # Tensors through /dev/shm to workers sharing it (auto), never (inline) or always (shm),
    # those of at least shm_min_bytes (gateway.workers.tensor_transport).
    tensor_transport: TensorTransportMode = "auto"
    shm_min_bytes: int = DEFAULT_SHM_MIN_BYTES
    api_keys: list[str] = field(default_factory=list)
    # gateway.server.access: /admin's own keys (none: the API keys guard it), whether /admin
    # answers at all (off on a non-loopback bind without an admin key), who may read /metrics
    admin_api_keys: list[str] = field(default_factory=list)
    admin_enabled: bool = True
    metrics_auth: MetricsAuth = "open"
    # gateway.ratelimit: each labelled key's label (--tenant-api-key LABEL:KEY; the keys are
    # in api_keys too), and the limits of this process; None: no limiter is made at all
    api_key_labels: dict[str, str] = field(default_factory=dict)
    rate_limits: RateLimits | None = None
    cors: CorsConfig = field(default_factory=CorsConfig)
    worker_dns: list[str] = field(default_factory=list)
    pool: PoolOptions = field(default_factory=PoolOptions)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    parsing: ParsingConfig = field(default_factory=ParsingConfig)
    limits: RequestLimits = field(default_factory=RequestLimits)
    otlp_traces_endpoint: str | None = None  # an OpenTelemetry collector (observability/)
    playground: bool = True  # the web page at / and /playground (gateway.playground)
    responses_store: StoreLimits = field(default_factory=StoreLimits)

    def surfaces(self) -> Surfaces:
        return Surfaces.of(
            self.api_keys, self.admin_api_keys, self.metrics_auth, self.admin_enabled
        )

    def __repr__(self) -> str:  # the dataclass's would print the keys
        return f"GatewayConfig(model={self.model!r}, workers={self.workers!r}, ...)"
