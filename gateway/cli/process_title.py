"""Keys given on the command line, taken out of the process title.

`ps` and /proc/PID/cmdline show a process's argv to every user of the machine, so a key
passed as `--api-key KEY` would stay readable there as long as the gateway runs. Files and
the environment are the way to pass keys; for whoever uses the flag anyway, the title is
rewritten at start (setproctitle overwrites the argv memory the kernel reads) with every key
masked. The window between exec and this call remains: the README says so.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence

MASK = "***"


def masked(argv: Sequence[str], secrets: Iterable[str]) -> list[str] | None:
    """`argv` with each secret replaced by ***, wherever it appears (`--api-key K`,
    `--api-key=K`, `--tenant-api-key label:K`, an abbreviated flag); None when none does."""
    keys = sorted({s for s in secrets if s}, key=len, reverse=True)  # longest first: a key
    # that holds a shorter one is masked whole
    out = list(argv)
    for i, arg in enumerate(out):
        for key in keys:
            arg = arg.replace(key, MASK)
        out[i] = arg
    return out if out != list(argv) else None


def hide_secrets(secrets: Iterable[str], argv: Sequence[str] | None = None) -> bool:
    """Rewrite this process's title without the secrets; True when it held one."""
    title = masked(sys.argv if argv is None else argv, secrets)
    if title is None:
        return False
    import setproctitle

    setproctitle.setproctitle(" ".join(title))
    return True
