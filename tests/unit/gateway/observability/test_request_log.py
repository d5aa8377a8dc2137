"""The gateway's log handler writes info lines in batches, warnings at once, nothing lost."""

from __future__ import annotations

import io
import logging
import os
import random
import time

from gateway.observability.request_log import BatchedStreamHandler, new_request_id


def make_logger(stream: io.StringIO, interval: float) -> tuple[logging.Logger, logging.Handler]:
    handler = BatchedStreamHandler(stream, interval=interval)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger = logging.getLogger(f"test-batched-{id(stream)}")
    logger.propagate = False
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    return logger, handler


def test_info_lines_wait_for_the_interval_warnings_do_not():
    stream = io.StringIO()
    logger, handler = make_logger(stream, interval=3600)  # the thread never flushes here
    logger.info("one")
    logger.info("two")
    assert stream.getvalue() == ""
    logger.warning("three")  # takes what waited with it, in order
    assert stream.getvalue() == "INFO one\nINFO two\nWARNING three\n"
    logger.info("four")
    handler.flush()  # what logging.shutdown() does at exit, before close()
    handler.close()
    assert stream.getvalue().endswith("WARNING three\nINFO four\n")


def test_the_background_thread_writes_batches():
    stream = io.StringIO()
    logger, _ = make_logger(stream, interval=0.02)
    for i in range(100):
        logger.info("line %d", i)
    deadline = time.monotonic() + 5
    while stream.getvalue().count("\n") < 100 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stream.getvalue().splitlines() == [f"INFO line {i}" for i in range(100)]


def test_request_ids_look_like_uuid4_hex_and_ignore_the_global_seed():
    random.seed(0)
    ids = [new_request_id() for _ in range(1000)]
    assert len(set(ids)) == 1000
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    random.seed(0)
    assert new_request_id() not in ids


def test_a_forked_child_makes_other_ids():
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.write(write, new_request_id().encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    assert len(child) == 32 and child != new_request_id()
