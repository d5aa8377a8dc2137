"""`mmgate serve`: the OpenAI-compatible gateway in front of VllmEngine workers."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from gateway.api.audio.form import AudioLimits
from gateway.cli import process_title
from gateway.ratelimit import flags as rate_flags
from gateway.render.prompt import GRPC_MAX_MESSAGE_BYTES
from gateway.render.worker_media import MM_PROCESSING
from gateway.server import tls
from gateway.server.access import (
    ADMIN_KEYS_ENV,
    API_KEYS_ENV,
    METRICS_AUTH,
    admin_enabled,
    log_posture,
    posture,
    read_keys,
)
from gateway.server.config import AdmissionConfig
from gateway.server.limits import MIB, RequestLimits
from gateway.workers import tls as worker_tls
from gateway.workers.pool import PoolOptions
from gateway.workers.tensor_transport import DEFAULT_SHM_MIN_BYTES, TRANSPORT_MODES

# vLLM's audio limits are environment variables; where set they are these flags' defaults,
# so one setting bounds vLLM and the gateway alike.
_VLLM_AUDIO = AudioLimits.from_env()

DESCRIPTION = """\
OpenAI-compatible HTTP server that renders chat templates, tokenizes, fetches and preprocesses
images itself, and streams generations from VllmEngine gRPC workers (`mmgate engine`, or
vLLM's own `--grpc` servicer). Flags are named as vLLM names them.
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mmgate serve", description=DESCRIPTION)
    p.add_argument(
        "--model",
        required=True,
        type=Path,
        metavar="DIR_OR_NAME",
        help="model directory (tokenizer, chat template, preprocessor config), or the model's "
        "name when the gateway has no copy: its files then come from the workers (GetTokenizer)",
    )
    p.add_argument(
        "--worker",
        action="append",
        default=[],
        metavar="grpc://HOST:PORT",
        help="an engine worker; repeat for several. grpcs://HOST:PORT: over TLS (see "
        "--ca-cert-paths)",
    )
    p.add_argument(
        "--worker-dns",
        action="append",
        default=[],
        metavar="grpc://NAME:PORT",
        help="a DNS name whose every address is a worker, re-resolved every --dns-interval "
        "seconds (e.g. a Kubernetes headless service); repeatable. grpcs://NAME:PORT: over "
        "TLS, each worker's certificate checked against NAME",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    p.add_argument("--port", type=int, default=8000, help="port (default: %(default)s)")
    p.add_argument(
        "--api-server-count",
        type=_positive,
        default=1,
        metavar="N",
        help="gateway processes serving the port, each with its own event loop and worker "
        "connections, under a supervisor that starts, restarts and stops them as one; "
        "admission limits, /admin/workers changes, /metrics and cache-aware routing stay "
        "gateway-wide. About one per core the gateway may use (README: Several processes). "
        "vLLM's flag (default: %(default)s: one process, no supervisor)",
    )
    p.add_argument("--served-model-name", help="model name clients use (default: --model)")
    p.add_argument("--chat-template", help="a chat template file or string overriding the model's")
    p.add_argument("--allowed-media-domains", nargs="*", help="only fetch images from these hosts")
    p.add_argument(
        "--allowed-local-media-path", type=Path, help="allow file:// images under this directory"
    )
    p.add_argument(
        "--max-video-bytes",
        type=_positive,
        default=64 * MIB,  # MediaPolicy.max_video_bytes
        metavar="BYTES",
        help="the largest video accepted, in encoded bytes (a clip, or a data:video/jpeg "
        "frame list's frames together); larger is a 400 (%(default)s = 64 MiB). A worker "
        "also refuses inline items above its --mm-max-item-bytes (32 MiB by default)",
    )
    p.add_argument(
        "--max-video-frames",
        type=_positive,
        default=18_000,  # MediaPolicy.max_video_frames
        metavar="N",
        help="the most frames a video's container may state; more is a 400 (%(default)s: ten "
        "minutes at 30 fps). Decoding reads every frame up to the last one sampled",
    )
    p.add_argument(
        "--max-video-seconds",
        type=_positive_float,
        default=600.0,  # MediaPolicy.max_video_seconds
        metavar="SECONDS",
        help="the longest video accepted, from its container's frame count and rate; longer "
        "is a 400 (default: %(default)s)",
    )
    p.add_argument(
        "--video-decode-timeout",
        type=_positive_float,
        default=30.0,  # MediaPolicy.video_decode_timeout
        metavar="SECONDS",
        help="how long the gateway may spend decoding one video's frames; longer is a 400 "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--max-video-decoded-mib",
        type=_positive,
        default=1024,  # MediaPolicy.max_video_decoded_bytes
        metavar="MIB",
        help="the most memory one video's sampled frames may take decoded (frames x height x "
        "width x 3 bytes), checked before decoding; more is a 400 (default: %(default)s)",
    )
    p.add_argument(
        "--max-audio-bytes",
        type=_positive,
        default=_VLLM_AUDIO.max_file_bytes,
        metavar="BYTES",
        help="the largest audio clip accepted, in encoded bytes (a chat clip, a transcription "
        "upload); larger is a 400 (default: %(default)s, vLLM's "
        "VLLM_MAX_AUDIO_CLIP_FILESIZE_MB when set, else 25 MiB)",
    )
    p.add_argument(
        "--max-audio-seconds",
        type=_positive_float,
        default=_VLLM_AUDIO.max_duration_s,
        metavar="SECONDS",
        help="the longest audio clip accepted, from its header and again from its samples; "
        "longer is a 400 (default: %(default)s, vLLM's VLLM_MAX_AUDIO_DECODE_DURATION_S when "
        "set, else 600)",
    )
    p.add_argument(
        "--max-audio-decoded-mib",
        type=_positive,
        default=max(1, _VLLM_AUDIO.max_decode_bytes // MIB),
        metavar="MIB",
        help="the most memory one audio clip may take decoded (samples x channels x 4 bytes); "
        "more is a 400 (default: %(default)s, vLLM's VLLM_MAX_AUDIO_DECODE_BYTES when set, "
        "else 256)",
    )
    p.add_argument(
        "--max-audio-sample-rate",
        type=_positive,
        default=192_000,  # MediaPolicy.max_audio_sample_rate
        metavar="HZ",
        help="the highest sample rate of an audio clip accepted; higher is a 400 "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--max-audio-channels",
        type=_positive,
        default=8,  # MediaPolicy.max_audio_channels
        metavar="N",
        help="the most channels an audio clip may have (models average them to one); more is "
        "a 400 (default: %(default)s)",
    )
    p.add_argument(
        "--audio-decode-timeout",
        type=_positive_float,
        default=30.0,  # MediaPolicy.audio_decode_timeout
        metavar="SECONDS",
        help="how long the gateway may spend decoding one audio clip; longer is a 400 "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--max-concurrent-videos",
        type=_positive,
        default=None,
        metavar="N",
        help="requests whose videos the gateway decodes and preprocesses at once; more wait. "
        "With --max-video-decoded-mib it bounds the memory videos take (default: half the "
        "cores, at least 1, leaving the rest to text and images)",
    )
    p.add_argument(
        "--max-mm-message-mib",
        type=_positive,
        default=2047,
        metavar="MIB",
        help="the most a request's preprocessed media may take on the wire to a worker; more "
        "is a 400 naming the size (default: %(default)s, what one gRPC message can carry)",
    )
    p.add_argument(
        "--trust-request-mm-kwargs",
        action="store_true",
        help="let requests set media_io_kwargs (a video's fps and num_frames), as vLLM's flag "
        "does; refused otherwise, since they change what loading a video costs",
    )
    p.add_argument(
        "--multimodal-tensor-transport",
        choices=TRANSPORT_MODES,
        default="auto",
        help="how preprocessed tensors reach a worker (SMG's flag): through /dev/shm segments "
        "rather than the gRPC socket when the worker shares this host's /dev/shm (auto: when "
        "its GetServerInfo shm_namespace_id, <boot_id>:<st_dev of /dev/shm>, equals ours; shm: "
        "always, you assert it does), or inline always. Segments are this user's only (mode "
        "0600): the worker must run as the same user (or root). A segment that cannot be "
        "written goes inline (default: %(default)s)",
    )
    p.add_argument(
        "--multimodal-shm-min-bytes",
        type=_positive,
        default=DEFAULT_SHM_MIN_BYTES,
        metavar="BYTES",
        help="the smallest tensor sent through /dev/shm; smaller ones go inline (default: "
        "%(default)s = 1 MiB; SMG's is 64 KiB)",
    )
    p.add_argument(
        "--allow-private-media-networks",
        nargs="*",
        default=[],
        metavar="CIDR",
        help="networks image URLs may resolve to despite being private/loopback",
    )
    p.add_argument(
        "--mm-processing",
        choices=MM_PROCESSING,
        default="auto",
        help="who preprocesses media: auto (the gateway for the model families it has a "
        "processor for, else workers started with --mm-processor inprocess), gateway (SMG: "
        "router) or worker. The gateway fetches and checks media either way "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--mm-processor-cache-gb",
        type=_cache_gib,
        default=4.0,
        metavar="GIB",
        help="preprocessed media items kept per gateway process, by a hash of their bytes and "
        "every processor option, least recently used out first: a chat resending an image is "
        "not decoded or preprocessed again; 0 disables (vLLM's flag and default: "
        "%(default)s)",
    )
    p.add_argument(
        "--api-key",
        action="append",
        default=[],
        help="require `Authorization: Bearer KEY` on /v1/*; repeat for several keys "
        "(also read from $VLLM_API_KEY, $MMGATE_API_KEYS and --api-key-file; prefer those: "
        "a command line shows in `ps`)",
    )
    p.add_argument(
        "--api-key-file",
        action="append",
        default=[],
        type=Path,
        metavar="PATH",
        help="a file of /v1 keys, one a line (`#` comments skipped); repeatable",
    )
    p.add_argument(
        "--admin-api-key",
        action="append",
        default=[],
        help="the keys /admin/* takes, instead of the /v1 ones (also $MMGATE_ADMIN_API_KEYS "
        "and --admin-api-key-file). Without one, on a non-loopback --host, /admin answers 404",
    )
    p.add_argument(
        "--admin-api-key-file",
        action="append",
        default=[],
        type=Path,
        metavar="PATH",
        help="a file of /admin keys, one a line; repeatable",
    )
    p.add_argument(
        "--insecure-open-admin",
        action="store_true",
        help="serve /admin on a non-loopback --host without an admin key (guarded by the /v1 "
        "keys if any, else open to anyone who reaches the port)",
    )
    p.add_argument(
        "--metrics-auth",
        choices=METRICS_AUTH,
        default="open",
        help="who may read /metrics: anyone (open), a /v1 key (api-key) or an /admin key "
        "(admin) (default: %(default)s)",
    )
    p.add_argument(
        "--allowed-origins",
        nargs="*",
        default=[],
        help="browser origins allowed by CORS, e.g. https://app.example or '*' "
        "(default: none; vLLM's default is '*')",
    )
    p.add_argument("--allowed-methods", nargs="*", default=["*"], help="CORS methods")
    p.add_argument("--allowed-headers", nargs="*", default=["*"], help="CORS request headers")
    p.add_argument("--allow-credentials", action="store_true", help="CORS: allow credentials")
    p.add_argument(
        "--playground",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="serve the web playground at / and /playground: chat with the model, images "
        "included, over this server's own API (default: on)",
    )
    tls.add_arguments(p)
    rate_flags.add_arguments(p)
    worker_tls.add_arguments(p)
    _parser_arguments(p)
    _pool_arguments(p)
    _limit_arguments(p)
    _store_arguments(p)
    p.add_argument(
        "--otlp-traces-endpoint",
        metavar="URL",
        help="send OpenTelemetry traces to this OTLP collector (gRPC, or HTTP with "
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf), continuing a client's traceparent "
        "and passing it on to the engine workers (start them with the same flag)",
    )
    p.add_argument(
        "--log-format",
        choices=["text", "json"],
        default="text",
        help="text (key=value fields) or one JSON object per line; both carry request ids",
    )
    return p


def _parser_arguments(p: argparse.ArgumentParser) -> None:
    from gateway.parsers import REASONING_PARSERS, TOOL_PARSERS

    g = p.add_argument_group(
        "tool calls and reasoning",
        "Output parsing as vLLM's server does it (same flags, same output). Start the engine "
        "workers with the same --reasoning-parser: vLLM's engine holds a request's "
        "structured output back until the reasoning ends.",
    )
    g.add_argument(
        "--reasoning-parser",
        metavar="NAME",
        help="split the model's thinking into `reasoning`: " + ", ".join(sorted(REASONING_PARSERS)),
    )
    g.add_argument(
        "--tool-call-parser",
        metavar="NAME",
        help="read tool calls out of the output: " + ", ".join(sorted(TOOL_PARSERS)),
    )
    g.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help='parse tool calls (needs --tool-call-parser); without it tool_choice "auto" and '
        "forced calls are refused, as in vLLM",
    )
    g.add_argument(
        "--exclude-tools-when-tool-choice-none",
        action="store_true",
        help='leave `tools` out of the prompt when tool_choice is "none"',
    )


def _pool_arguments(p: argparse.ArgumentParser) -> None:
    from gateway.workers.routing import POLICIES
    from gateway.workers.worker import STREAM_CLIENTS

    g = p.add_argument_group("workers: routing, health and admission")
    d = PoolOptions()
    g.add_argument("--policy", choices=POLICIES, default=d.policy, help="routing policy")
    g.add_argument(
        "--balance-threshold",
        type=int,
        default=d.balance_threshold,
        help="cache_aware balances load instead once workers' request counts differ by more "
        "(default: %(default)s)",
    )
    g.add_argument(
        "--cache-threshold",
        type=float,
        default=d.cache_threshold,
        help="cache_aware follows a prefix match covering at least this share of the prompt",
    )
    g.add_argument("--health-interval", type=float, default=d.health_interval, help="seconds")
    g.add_argument(
        "--health-fall", type=int, default=d.health_fall, help="failed checks to remove a worker"
    )
    g.add_argument(
        "--health-rise", type=int, default=d.health_rise, help="passed checks to bring it back"
    )
    g.add_argument(
        "--breaker-failures",
        type=int,
        default=d.breaker_failures,
        help="consecutive failed calls that open a worker's circuit",
    )
    g.add_argument(
        "--breaker-cooldown", type=float, default=d.breaker_cooldown, help="seconds it stays open"
    )
    g.add_argument(
        "--retries",
        type=int,
        default=d.retries,
        help="other workers to try when a call fails before its first token",
    )
    g.add_argument("--dns-interval", type=float, default=d.dns_interval, help="seconds")
    g.add_argument(
        "--stream-client",
        choices=STREAM_CLIENTS,
        default=d.stream_client,
        help="client for the streamed Generate calls: mmgate's own HTTP/2 client, which reads "
        "the stream in the event loop (several times less CPU per token), or grpcio's grpc.aio "
        "(default: %(default)s)",
    )
    a = AdmissionConfig()
    g.add_argument(
        "--max-in-flight",
        type=int,
        default=a.max_in_flight,
        help="generation requests worked on at once (default: %(default)s)",
    )
    g.add_argument(
        "--max-queue",
        type=int,
        default=a.max_queue,
        help="requests waiting beyond that; more get 429 (default: %(default)s)",
    )
    g.add_argument(
        "--queue-timeout",
        type=float,
        default=a.queue_timeout,
        help="seconds a request may wait; then 503 (default: %(default)s)",
    )


def _limit_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "request limits",
        "What one request may hold; past a limit it is refused with a 400 (413 for the body) "
        "naming the limit, before anything is fetched or sent to a worker.",
    )
    d = RequestLimits()
    limits = (
        ("--max-request-body-bytes", d.max_body_bytes, "request body size, images inline"),
        ("--max-json-depth", d.max_json_depth, "nesting of the JSON body"),
        ("--max-messages", d.max_messages, "messages of a chat request"),
        ("--max-content-parts", d.max_content_parts, "content parts of one message"),
        ("--max-images-per-request", d.max_images, "images of a chat request"),
        ("--max-stop-strings", d.max_stop_strings, "stop strings of a request"),
    )
    for flag, default, what in limits:
        g.add_argument(
            flag, type=_positive, default=default, help=f"at most this: {what} (%(default)s)"
        )


def _store_arguments(p: argparse.ArgumentParser) -> None:
    from gateway.api.responses.memory_store import StoreLimits

    g = p.add_argument_group(
        "Responses API store",
        "Responses created with store=true (OpenAI's default) are kept in this process's "
        "memory for GET /v1/responses/{id} and previous_response_id. Past the size bound the "
        "least recently used go first; past the age bound, those not written since. Each "
        "gateway replica has its own store: route a conversation's requests to one replica "
        "(sticky sessions).",
    )
    d = StoreLimits()
    g.add_argument(
        "--responses-store-max-mib",
        type=float,
        metavar="MIB",
        default=d.max_bytes / MIB,
        help="bytes held by stored responses, in MiB; 0 stores nothing (%(default)s)",
    )
    g.add_argument(
        "--responses-store-max-age",
        type=_positive_float,
        metavar="SECONDS",
        default=d.max_age_seconds,
        help="seconds a stored response is kept after its last write (%(default)s)",
    )


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:  # (refuses nan too)
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return value


def _cache_gib(text: str) -> float:
    value = float(text)
    if not value >= 0 or value == float("inf"):  # (refuses nan too)
        raise argparse.ArgumentTypeError(f"must be a size of at least 0, got {text}")
    return value


def main(argv: list[str]) -> int:
    from gateway.api.responses.memory_store import StoreLimits
    from gateway.errors import MmgateError
    from gateway.observability.request_log import configure_logging
    from gateway.parsers.config import ParsingConfig
    from gateway.render.templates import read_chat_template_arg
    from gateway.render.worker_media import mm_processing_mode
    from gateway.server.app import create_app
    from gateway.server.config import CorsConfig, GatewayConfig
    from gateway.workers.worker import parse_address
    from multimodal.media import MediaPolicy

    parser = build_parser()
    args = parser.parse_args(argv)
    # One prompt at a time: tokenizers' rayon pool would only add a thread hop (and its
    # spinning) to each; an operator's own setting wins.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if not args.worker and not args.worker_dns:
        parser.error("give at least one --worker or --worker-dns")
    for url in args.worker + args.worker_dns:
        try:
            parse_address(url)
        except MmgateError as error:
            parser.error(error.message)
    parsing = ParsingConfig(
        reasoning_parser=args.reasoning_parser,
        tool_call_parser=args.tool_call_parser,
        enable_auto_tool_choice=args.enable_auto_tool_choice,
        exclude_tools_when_tool_choice_none=args.exclude_tools_when_tool_choice_none,
    )
    try:
        parsing.check()
    except ValueError as error:
        parser.error(str(error))
    try:
        http_tls = tls.from_args(args)
        workers_tls = worker_tls.from_args(args)
    except ValueError as error:
        parser.error(str(error))
    try:
        # $VLLM_API_KEY is one key, as vLLM reads it (a comma in it is part of the key)
        given = args.api_key + [os.environ.get("VLLM_API_KEY", "")]
        api_keys = read_keys(given, args.api_key_file, [API_KEYS_ENV])
        admin_keys = read_keys(args.admin_api_key, args.admin_api_key_file, [ADMIN_KEYS_ENV])
        key_labels = rate_flags.read_labelled_keys(args.tenant_api_key, args.tenant_api_key_file)
    except OSError as error:
        parser.error(f"cannot read a key file: {error.filename}: {error.strerror}")
    except ValueError as error:
        parser.error(str(error))
    process_title.hide_secrets([*api_keys, *admin_keys, *key_labels])
    # labelled keys are /v1 keys too (SMG: they layer on top of --api-key)
    api_keys = list(dict.fromkeys([*api_keys, *key_labels]))
    try:
        rate_limits = rate_flags.from_args(
            args, key_labels, args.max_in_flight, args.api_server_count
        )
    except OSError as error:
        parser.error(f"cannot read {error.filename}: {error.strerror}")
    except ValueError as error:
        parser.error(str(error))
    if args.metrics_auth == "api-key" and not api_keys:
        parser.error("--metrics-auth api-key needs an API key (--api-key or its file or env)")
    if args.metrics_auth == "admin" and not (admin_keys or api_keys):
        parser.error("--metrics-auth admin needs a key (--admin-api-key or --api-key)")
    policy = MediaPolicy(
        allowed_domains=tuple(args.allowed_media_domains) if args.allowed_media_domains else None,
        allowed_networks=tuple(args.allow_private_media_networks),
        local_root=args.allowed_local_media_path,
        max_video_bytes=args.max_video_bytes,
        max_video_frames=args.max_video_frames,
        max_video_seconds=args.max_video_seconds,
        video_decode_timeout=args.video_decode_timeout,
        max_video_decoded_bytes=args.max_video_decoded_mib * MIB,
        max_audio_bytes=args.max_audio_bytes,
        max_audio_seconds=args.max_audio_seconds,
        max_audio_decoded_bytes=args.max_audio_decoded_mib * MIB,
        max_audio_sample_rate=args.max_audio_sample_rate,
        max_audio_channels=args.max_audio_channels,
        audio_decode_timeout=args.audio_decode_timeout,
    )
    config = GatewayConfig(
        model=args.model,
        workers=args.worker,
        served_model_name=args.served_model_name,
        chat_template=read_chat_template_arg(args.chat_template) if args.chat_template else None,
        media_policy=policy,
        max_concurrent_videos=args.max_concurrent_videos,
        max_mm_message_bytes=min(args.max_mm_message_mib * MIB, GRPC_MAX_MESSAGE_BYTES),
        trust_request_mm_kwargs=args.trust_request_mm_kwargs,
        mm_processor_cache_gb=args.mm_processor_cache_gb,
        mm_processing=mm_processing_mode(args.mm_processing),
        tensor_transport=args.multimodal_tensor_transport,
        shm_min_bytes=args.multimodal_shm_min_bytes,
        api_keys=api_keys,
        admin_api_keys=admin_keys,
        admin_enabled=admin_enabled(args.host, admin_keys, args.insecure_open_admin),
        metrics_auth=args.metrics_auth,
        api_key_labels=key_labels,
        rate_limits=rate_limits,
        cors=CorsConfig(
            allowed_origins=args.allowed_origins,
            allowed_methods=args.allowed_methods,
            allowed_headers=args.allowed_headers,
            allow_credentials=args.allow_credentials,
        ),
        worker_dns=args.worker_dns,
        pool=PoolOptions(
            policy=args.policy,
            health_interval=args.health_interval,
            health_fall=args.health_fall,
            health_rise=args.health_rise,
            breaker_failures=args.breaker_failures,
            breaker_cooldown=args.breaker_cooldown,
            retries=args.retries,
            dns_interval=args.dns_interval,
            balance_threshold=args.balance_threshold,
            cache_threshold=args.cache_threshold,
            stream_client=args.stream_client,
            tls=workers_tls,
        ),
        admission=AdmissionConfig(args.max_in_flight, args.max_queue, args.queue_timeout),
        otlp_traces_endpoint=args.otlp_traces_endpoint,
        playground=args.playground,
        responses_store=StoreLimits(
            max_bytes=max(0, int(args.responses_store_max_mib * MIB)),
            max_age_seconds=args.responses_store_max_age,
        ),
        limits=RequestLimits(
            max_body_bytes=args.max_request_body_bytes,
            max_json_depth=args.max_json_depth,
            max_messages=args.max_messages,
            max_content_parts=args.max_content_parts,
            max_images=args.max_images_per_request,
            max_stop_strings=args.max_stop_strings,
        ),
        parsing=parsing,
    )
    configure_logging(args.log_format)
    log_posture(
        *posture(
            args.host,
            args.port,
            config.surfaces(),
            bool(admin_keys),
            config.playground,
            config.workers + config.worker_dns,
            http_tls,
            rate_limits,
            workers_tls,
        )
    )
    if args.api_server_count > 1:
        from gateway.server.processes.supervisor import Supervisor

        count = args.api_server_count
        return Supervisor(count, config, args.host, args.port, args.log_format, http_tls).run()
    settings = tls.server_config(
        create_app(config),
        http_tls,
        host=args.host,
        port=args.port,
        log_config=None,
        access_log=False,
    )
    server = tls.Server(settings, http_tls)
    server.run()
    # uvicorn.run's exit code when the server never started (e.g. the port is taken)
    return 0 if server.started else 3
