"""One gateway process of several: the usual app under uvicorn, on the supervisor's socket.

Started with multiprocessing's `spawn` (a fresh interpreter: no event loop, thread or lock is
inherited half-way); the listening socket, the shared table, the control pipe and the shared
response store's path come in as arguments. It leaves the supervisor's process group, so a
terminal's Ctrl-C reaches the supervisor alone, which stops the children in order (a second
signal to a uvicorn that is already stopping would cut its open streams).
"""

from __future__ import annotations

import os
import socket
from multiprocessing.connection import Connection
from pathlib import Path

from gateway.server.config import GatewayConfig
from gateway.server.processes.shared import ProcessTable
from gateway.server.tls import HttpTls


def run_child(
    index: int,
    config: GatewayConfig,
    sock: socket.socket,
    table: ProcessTable,
    conn: Connection,
    log_format: str,
    metrics_dir: Path,
    store_path: Path,
    tls: HttpTls | None = None,
) -> None:
    from gateway.observability.request_log import configure_logging
    from gateway.server.app import create_app
    from gateway.server.processes.control import ControlChannel
    from gateway.server.processes.member import Member
    from gateway.server.tls import Server, server_config

    os.setpgid(0, 0)
    configure_logging(log_format, process_index=index)
    control = ControlChannel(conn)
    app = create_app(config, Member(index, table, control, metrics_dir, store_path))
    server = Server(server_config(app, tls, log_config=None, access_log=False), tls)

    def stop() -> None:  # the supervisor is gone: nobody else will tell us
        server.should_exit = True

    control.on_lost = stop
    server.run(sockets=[sock])
