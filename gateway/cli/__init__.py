"""The `mmgate` command: `main` dispatches to a subcommand module (serve, engine, demo,
preprocess), each imported only when it runs."""

from gateway.cli.main import main

__all__ = ["main"]
