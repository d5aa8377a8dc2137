"""The control channel: what one gateway process learns reaches the others through the
supervisor (worker changes, cache-aware routing inserts), over real pipes."""

from __future__ import annotations

import asyncio
import multiprocessing

from gateway.server.config import GatewayConfig
from gateway.server.processes.control import ROUTES, WORKERS, ControlChannel, decode, encode
from gateway.server.processes.supervisor import Child, Supervisor
from gateway.workers.pool import PoolOptions, WorkerPool
from gateway.workers.routing import BLOCK_TOKENS, PrefixIndex, Router

W1, W2, W3 = "grpc://127.0.0.1:1", "grpc://127.0.0.1:2", "grpc://127.0.0.1:3"


class _Process:  # what the relay reads of a child's process
    pid, exitcode, sentinel = None, None, None


def _supervisor(count: int) -> tuple[Supervisor, list]:
    """A supervisor relaying between `count` children's pipes (no processes started)."""
    sup = Supervisor(count, GatewayConfig(model=".", workers=[W1]), "127.0.0.1", 0, "text")
    ends = []
    for index in range(count):
        ours, theirs = multiprocessing.Pipe()
        sup.children[index] = Child(index, _Process(), ours)
        sup.children[index].start_writer()
        ends.append(theirs)
    return sup, ends


def test_the_supervisor_passes_a_message_to_every_other_child_and_keeps_the_worker_list():
    sup, ends = _supervisor(3)
    ends[1].send_bytes(encode(WORKERS, ("add", W2)))
    sup._receive(sup.children[1])
    for index in (0, 2):
        assert ends[index].poll(2) and decode(ends[index].recv_bytes()) == (WORKERS, ("add", W2))
    assert not ends[1].poll(0.1)  # not echoed to the sender
    assert sup.workers == [W1, W2]  # a restarted child starts with these
    ends[0].send_bytes(encode(WORKERS, ("remove", W1)))
    sup._receive(sup.children[0])
    assert sup.workers == [W2]
    routes = encode(ROUTES, [(W2, [1, 2, 3])])
    ends[2].send_bytes(routes)
    sup._receive(sup.children[2])
    assert ends[1].poll(2) and ends[1].recv_bytes() == encode(WORKERS, ("remove", W1))
    assert ends[1].recv_bytes() == routes  # relayed as it came, unread
    assert ends[0].poll(2) and ends[0].recv_bytes() == routes
    assert sup.workers == [W2]


def _prompt(conversation: int, turns: int) -> list[int]:
    return [conversation * 1000 + i for i in range(BLOCK_TOKENS * 4 * turns)]


def test_a_conversation_routed_by_one_process_is_followed_by_another():
    """Two processes' pools, joined as the supervisor joins them: each next turn goes to the
    worker that got the first, whichever process routes it."""

    async def main() -> list[bool]:
        options = PoolOptions(policy="cache_aware")
        pools = [WorkerPool([W1, W2, W3], options) for _ in range(2)]
        sup, ends = _supervisor(2)
        channels = [ControlChannel(end) for end in ends]
        for channel, pool in zip(channels, pools):
            channel.attach(pool)
        same = []
        for conversation in range(12):
            first = pools[conversation % 2].router.choose(
                list(pools[conversation % 2].workers.values()), _prompt(conversation, 1)
            )
            await asyncio.sleep(0)  # the loop turn's inserts go up as one message
            sup._receive(sup.children[conversation % 2])
            await asyncio.sleep(0.05)  # and come down to the other process
            other = pools[1 - conversation % 2]
            second = other.router.choose(list(other.workers.values()), _prompt(conversation, 2))
            same.append((second.worker.url, second.outcome) == (first.worker.url, "cache_hit"))
        for channel in channels:
            channel.detach()
        return same

    assert all(asyncio.run(main()))


def test_without_the_channel_the_other_process_would_guess():
    """The test above can fail: a process that was not told routes most second turns of a
    12-conversation load elsewhere than the first."""
    routers = [Router("cache_aware"), Router("cache_aware")]
    workers = [_W(W1), _W(W2), _W(W3)]
    same = 0
    for conversation in range(12):
        first = routers[conversation % 2].choose(workers, _prompt(conversation, 1))
        second = routers[1 - conversation % 2].choose(workers, _prompt(conversation, 2))
        same += first.worker is second.worker
    assert same < 12


def test_block_hashes_are_equal_in_every_process():
    """Inserts are passed on as hashes: they must mean the same in the other process."""
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        theirs = pool.apply(PrefixIndex.block_hashes, (_prompt(3, 2),))
    assert theirs == PrefixIndex.block_hashes(_prompt(3, 2))


class _W:
    def __init__(self, url: str) -> None:
        self.url, self.assigned = url, 0


def test_round_robin_goes_round_once_for_every_process():
    """Two processes' routers on one table's turns: together they alternate the workers, as
    one gateway's round robin does (each on its own counter could send both to W1)."""
    from gateway.server.processes.shared import ProcessTable

    table = ProcessTable(multiprocessing.get_context("spawn"), 2)
    routers = [Router("round_robin"), Router("round_robin")]
    for router in routers:
        router.share_turns(table.turns())
    workers = [_W(W1), _W(W2)]
    picked = [routers[i % 2].choose(workers).worker.url for i in range(6)]
    assert picked == [W1, W2] * 3
