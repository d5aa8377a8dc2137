"""Request ids and structured logs: every log line of a request carries its id.

The id is the client's `X-Request-Id` when it sends one (as vLLM does), else a fresh one; it is
returned in the response's `X-Request-Id` header and prefixes the engine request ids.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import random
import sys
import threading
import time

_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "mmgate_request_id", default=None
)


_from_client: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "mmgate_request_id_from_client", default=False
)


def current_request_id() -> str | None:
    return _request_id.get()


# Our own generator, seeded from the OS (again in a forked child): an in-process engine that
# seeds the global one (vLLM does, with --seed) must not make ids repeat across processes.
_ids = random.Random()
os.register_at_fork(after_in_child=_ids.seed)


def new_request_id() -> str:
    """32 random hex digits, as uuid4().hex, without its getrandom() system call: that call
    gives up the GIL, and under load taking it back from the preprocessing threads can wait."""
    return f"{_ids.getrandbits(128):032x}"


def bind_request_id(value: str | None) -> tuple[contextvars.Token, contextvars.Token]:
    return _request_id.set(value or new_request_id()), _from_client.set(bool(value))


def unbind_request_id(tokens: tuple[contextvars.Token, contextvars.Token]) -> None:
    _request_id.reset(tokens[0])
    _from_client.reset(tokens[1])


def engine_request_id(body_request_id: str | None) -> str:
    """As vLLM: the client's X-Request-Id, else the body's request_id, else our own id."""
    if _from_client.get() or not body_request_id:
        return current_request_id() or new_request_id()
    return body_request_id


class _WithRequestId(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = current_request_id()
        return True


class _WithProcess(logging.Filter):
    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def filter(self, record: logging.LogRecord) -> bool:
        record.gateway_process = self.index
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request_id and extra fields."""

    RESERVED = frozenset(logging.makeLogRecord({}).__dict__) | {
        "message",
        "request_id",
        "asctime",
    }

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if getattr(record, "request_id", None):
            entry["request_id"] = record.request_id
        entry.update(
            (k, v) for k, v in record.__dict__.items() if k not in self.RESERVED and v is not None
        )
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """Human-readable, with the request id and extra fields as key=value pairs."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = {
            k: v
            for k, v in record.__dict__.items()
            if k not in JsonFormatter.RESERVED and v is not None
        }
        if getattr(record, "request_id", None):
            fields = {"request_id": record.request_id, **fields}
        return line + "".join(f" {k}={v}" for k, v in fields.items())


class BatchedStreamHandler(logging.StreamHandler):
    """A StreamHandler that writes what it was given at most every `interval` seconds (a
    background thread), at once for warnings and errors, and on close. Under load the gateway
    writes one access line per request; a write per line gives up the GIL each time, and the
    event loop can then wait for the preprocessing threads to hand it back. A process killed
    with SIGKILL loses at most `interval` seconds of info lines."""

    def __init__(self, stream=None, interval: float = 0.1) -> None:  # noqa: ANN001 - as logging
        super().__init__(stream)
        self.pending: list[str] = []
        self.interval = interval
        threading.Thread(target=self._flush_periodically, name="log-flush", daemon=True).start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + self.terminator
        except Exception:
            self.handleError(record)
            return
        self.pending.append(line)  # under the handler's lock (Handler.handle)
        if record.levelno >= logging.WARNING:
            self._write()

    def flush(self) -> None:
        self.acquire()
        try:
            self._write()
        finally:
            self.release()

    def _write(self) -> None:
        if self.pending:
            lines, self.pending = "".join(self.pending), []
            try:
                self.stream.write(lines)
                self.stream.flush()
            except (OSError, ValueError):  # stream closed or gone: nowhere to report it
                pass

    def _flush_periodically(self) -> None:
        while True:
            time.sleep(self.interval)
            self.flush()


def configure_logging(
    log_format: str = "text", level: int = logging.INFO, process_index: int | None = None
) -> None:
    """Root handler for the gateway process; uvicorn's loggers go through it too.
    `process_index`: one of several gateway processes (`--api-server-count`), named on each
    line as `gateway_process=INDEX`."""
    handler = BatchedStreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    handler.addFilter(_WithRequestId())
    if process_index is not None:
        handler.addFilter(_WithProcess(process_index))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    # The gateway writes its own access line per request (with id, status and duration).
    logging.getLogger("uvicorn.access").disabled = True
