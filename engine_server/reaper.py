"""vLLM's EngineCore never outlives `mmgate engine`, whatever ends it.

AsyncLLM runs the engine core in a child process (spawned on CPUs, forked by default on GPUs),
which may start workers of its own. A graceful stop shuts them down, but a worker killed with
SIGKILL (the OOM killer, `kill -9`, a supervisor's last resort) runs no code, and its children
were left behind holding their memory and GPUs. The reaper is a small process the worker
starts first: it notes the worker's descendants every half second and, once the worker is
gone, kills those still running. It ignores the signals a terminal or a process-group kill
sends (it must outlive the worker) and exits with it.

    python -m engine_server.reaper PID
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

INTERVAL = 0.5  # seconds between looks at the worker's descendants


def start_reaper() -> subprocess.Popen:
    """The reaper for this process (started before any child it should watch)."""
    command = [sys.executable, "-m", "engine_server.reaper", str(os.getpid())]
    return subprocess.Popen(command, stdin=subprocess.DEVNULL, close_fds=True)


def reap_after(pid: int) -> int:
    """Watch process `pid`; when it is gone, SIGKILL the descendants it had. Returns how many
    were still running."""
    import psutil

    try:
        watched = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return 0
    me, seen = os.getpid(), {}
    while watched.is_running() and watched.status() != psutil.STATUS_ZOMBIE:
        try:
            seen = {p.pid: p for p in watched.children(recursive=True) if p.pid != me}
        except psutil.NoSuchProcess:
            break
        time.sleep(INTERVAL)
    left = [p for p in seen.values() if p.is_running()]  # is_running: same pid, same process
    for process in left:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    return len(left)


def main(argv: list[str]) -> int:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    left = reap_after(int(argv[0]))
    if left:
        print(f"mmgate engine reaper: killed {left} process(es) left behind", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
