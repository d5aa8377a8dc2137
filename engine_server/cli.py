"""`mmgate engine`: a VllmEngine gRPC worker. Takes every vLLM engine argument."""

from __future__ import annotations

import asyncio
import logging
import sys

DESCRIPTION = """\
Serve a model over the vllm.grpc.engine.VllmEngine gRPC protocol (the wire SMG speaks).
Clients (the mmgate gateway, SMG, llm-d) send token ids and preprocessed multimodal
tensors; the worker feeds vLLM's AsyncLLM directly, bypassing vLLM's HF processor.
With --mm-processor inprocess it also takes raw media references (media_refs) for models
the router does not preprocess, and runs vLLM's own processor on them.

Without --model it serves a tiny random-weight chat model built locally (a demo).
Every vLLM engine argument (--max-model-len, --dtype, --enforce-eager, ...) is accepted.
"""


def build_parser():
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from engine_server.media_refs import DEFAULT_MAX_ITEM_BYTES, ENV, ITEM_BYTES_ENV, MODES
    from engine_server.mm_item_cache import DEFAULT_ITEM_SENDERS

    parser = FlexibleArgumentParser(prog="mmgate engine", description=DESCRIPTION)
    group = parser.add_argument_group("mmgate engine server")
    group.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    group.add_argument("--port", type=int, default=50051, help="port (default: %(default)s)")
    group.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        help="seconds to let in-flight requests finish on SIGTERM (default: %(default)s)",
    )
    group.add_argument(
        "--mm-processor",
        choices=MODES,
        type=str.lower,
        default=None,
        help="worker-side media processing: off refuses media_refs (routers preprocess); "
        "inprocess fetches them (under --allowed-media-domains / --allowed-local-media-path) "
        f"and runs vLLM's own processor. Unset: ${ENV}, else off",
    )
    group.add_argument(
        "--mm-max-item-bytes",
        type=int,
        default=None,
        help="largest inline (data:) media item accepted in media_refs, in bytes "
        f"(default: ${ITEM_BYTES_ENV}, else {DEFAULT_MAX_ITEM_BYTES})",
    )
    group.add_argument(
        "--mm-item-cache-senders",
        type=int,
        default=DEFAULT_ITEM_SENDERS,
        help="send-once item cache: how many gateway processes' shares of it to keep at once. "
        "Each sender (one per `mmgate serve` process: --api-server-count times the replicas "
        "in front of this worker) gets --mm-processor-cache-gb divided by this; one more "
        "sender drops the least recently used share whole. Size it to the number of gateway "
        "processes across replicas (default: %(default)s)",
    )
    from engine_server import tls

    tls.add_arguments(group)
    AsyncEngineArgs.add_cli_args(parser)
    parser.set_defaults(model=None)
    return parser


def main(argv: list[str]) -> int:
    from vllm.engine.arg_utils import AsyncEngineArgs

    from engine_server import tls
    from engine_server.media_refs import MediaRefSettings
    from engine_server.server import ServeOptions, serve

    parser = build_parser()
    args = parser.parse_args(argv)
    try:  # before the model loads: a bad setting must not cost a load
        media = MediaRefSettings.resolve(args.mm_processor, args.mm_max_item_bytes)
        server_tls = tls.from_args(args)
    except ValueError as error:
        parser.error(str(error))
    if args.mm_item_cache_senders < 1:
        parser.error("--mm-item-cache-senders must be at least 1")
    if args.model is None:
        from engine_server.tiny_models import ensure_model

        print("no --model given: serving the built-in tiny demo model", file=sys.stderr)
        args.model = str(ensure_model("text"))
        args.tokenizer = args.tokenizer or args.model
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    options = ServeOptions(
        host=args.host,
        port=args.port,
        drain_timeout=args.drain_timeout,
        media=media,
        item_senders=args.mm_item_cache_senders,
        tls=server_tls,
    )
    asyncio.run(serve(AsyncEngineArgs.from_cli_args(args), options))
    return 0
