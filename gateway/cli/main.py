"""The `mmgate` command: one entry point, a subcommand per job."""

from __future__ import annotations

import os
import sys

USAGE = """\
usage: mmgate <command> [options]

commands:
  serve    the OpenAI-compatible gateway in front of engine workers
  engine   serve a model as a VllmEngine gRPC worker (vLLM behind it; any vLLM engine arg)
  demo     a tiny local vision model behind a worker and the gateway; one image chat request
  preprocess  run the gateway's media preprocessing on one request and show the tensors

Run `mmgate <command> --help` for the options of each.
"""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return 0
    command, rest = args[0], args[1:]
    if command == "engine":
        from engine_server.cli import main as engine_main

        return engine_main(rest)
    if command == "serve":
        # Image work runs in our own kernels, a request per thread: BLAS threads would only
        # fight them (and the event loop) for the cores.
        for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(name, "1")
        from gateway.cli.serve import main as serve_main

        return serve_main(rest)
    if command == "preprocess":
        from gateway.cli.preprocess import main as preprocess_main

        return preprocess_main(rest)
    if command == "demo":
        from gateway.cli.demo import main as demo_main

        return demo_main(rest)
    print(f"mmgate: unknown command {command!r}\n\n{USAGE}", file=sys.stderr, end="")
    return 2
