"""`mmgate serve`: the OpenAI-compatible gateway in front of VllmEngine workers."""

from __future__ import annotations

import argparse
import logging
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
        help="model directory (tokenizer, chat template, preprocessor config)",
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
    return p


def main(argv: list[str]) -> int:
    import uvicorn

    from gateway.app import GatewayConfig, create_app
    from gateway.chat import read_chat_template_arg
    from multimodal.media import MediaPolicy

    args = build_parser().parse_args(argv)
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
    )
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    uvicorn.run(create_app(config), host=args.host, port=args.port, log_level="info")
    return 0
