"""The supervisor's rules for a child that exits: restart it, or stop the gateway (exit 1)
when children keep dying; while stopping, a child's exit is judged, never restarted."""

from __future__ import annotations

import multiprocessing
import signal
from pathlib import Path

from gateway.server.config import GatewayConfig
from gateway.server.processes.shared import ProcessTable
from gateway.server.processes.supervisor import MAX_RESTARTS, Child, Supervisor


class _Exited:
    def __init__(self, code: int) -> None:
        self.pid, self.exitcode, self.sentinel = 4242, code, None

    def join(self, timeout: float | None = None) -> None:
        pass


def _supervisor(tmp_path: Path) -> tuple[Supervisor, list[int]]:
    sup = Supervisor(2, GatewayConfig(model=".", workers=[]), "127.0.0.1", 0, "text")
    sup.table = ProcessTable(multiprocessing.get_context("spawn"), 2)
    sup.metrics_dir = tmp_path
    started: list[int] = []

    def start(index: int) -> None:
        started.append(index)
        sup.children[index] = Child(index, _Exited(0), multiprocessing.Pipe()[0])

    sup._start = start
    return sup, started


def test_a_dead_child_is_restarted_until_children_keep_dying(tmp_path):
    sup, started = _supervisor(tmp_path)
    for _ in range(MAX_RESTARTS):
        sup.children[1] = Child(1, _Exited(-9), multiprocessing.Pipe()[0])
        sup._exited(sup.children[1])
    assert started == [1] * MAX_RESTARTS and not sup.failed
    sup.children[1] = Child(1, _Exited(-9), multiprocessing.Pipe()[0])
    sup._exited(sup.children[1])  # one death too many within the window
    assert started == [1] * MAX_RESTARTS
    assert sup.failed and sup.stopping


def test_while_stopping_a_child_is_judged_by_its_exit(tmp_path):
    sup, started = _supervisor(tmp_path)
    sup.stopping = 1
    for index, code in enumerate((-signal.SIGTERM, 0)):  # uvicorn exits by its signal
        sup.children[index] = Child(index, _Exited(code), multiprocessing.Pipe()[0])
        sup._exited(sup.children[index])
    assert not sup.failed and not started and not sup.children
    sup.children[0] = Child(0, _Exited(-9), multiprocessing.Pipe()[0])
    sup._exited(sup.children[0])
    assert sup.failed
