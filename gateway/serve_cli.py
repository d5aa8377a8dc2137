"""`mmgate serve`: the OpenAI-compatible gateway in front of VllmEngine workers."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

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
        required=True,
        metavar="grpc://HOST:PORT",
        help="an engine worker; repeat for several (round-robin)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    p.add_argument("--port", type=int, default=8000, help="port (default: %(default)s)")
    p.add_argument("--served-model-name", help="model name clients use (default: --model)")
    p.add_argument("--chat-template", help="a chat template file or string overriding the model's")
    p.add_argument("--allowed-media-domains", nargs="*", help="only fetch images from these hosts")
    p.add_argument(
        "--allowed-local-media-path", type=Path, help="allow file:// images under this directory"
    )
    p.add_argument(
        "--allow-private-media-networks",
        nargs="*",
        default=[],
        metavar="CIDR",
        help="networks image URLs may resolve to despite being private/loopback",
    )
    p.add_argument(
        "--api-key",
        action="append",
        default=[],
        help="require `Authorization: Bearer KEY` on /v1/*; repeat for several keys "
        "(also read from $VLLM_API_KEY)",
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
        "--log-format",
        choices=["text", "json"],
        default="text",
        help="text (key=value fields) or one JSON object per line; both carry request ids",
    )
    return p


def main(argv: list[str]) -> int:
    import uvicorn

    from gateway.app import CorsConfig, GatewayConfig, create_app
    from gateway.chat import read_chat_template_arg
    from gateway.request_log import configure_logging
    from multimodal.media import MediaPolicy

    args = build_parser().parse_args(argv)
    env_key = os.environ.get("VLLM_API_KEY")
    policy = MediaPolicy(
        allowed_domains=tuple(args.allowed_media_domains) if args.allowed_media_domains else None,
        allowed_networks=tuple(args.allow_private_media_networks),
        local_root=args.allowed_local_media_path,
    )
    config = GatewayConfig(
        model=args.model,
        workers=args.worker,
        served_model_name=args.served_model_name,
        chat_template=read_chat_template_arg(args.chat_template) if args.chat_template else None,
        media_policy=policy,
        api_keys=args.api_key + ([env_key] if env_key else []),
        cors=CorsConfig(
            allowed_origins=args.allowed_origins,
            allowed_methods=args.allowed_methods,
            allowed_headers=args.allowed_headers,
            allow_credentials=args.allow_credentials,
        ),
    )
    configure_logging(args.log_format)
    uvicorn.run(
        create_app(config), host=args.host, port=args.port, log_config=None, access_log=False
    )
    return 0
