"""Issue 32, point 3: broadcast, all-gather, reduce-scatter and barrier keep every guarantee
of an all-reduce: the world is the one launched in (a change before the start fails it on
every peer), disagreeing peers are rejected on every peer naming each descriptor, the
master's deadlock detection covers them, many run at once with mixed kinds, tickets start
them early, and the next master decides those in doubt."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import pccl_aio as pccl
from pccl_aio._peer import testing
from tests.helpers import join_peers
from tests.integration.test_failover import _drop_completions, new_master, running

pytestmark = pytest.mark.timeout(60)

KINDS = ["broadcast", "all_gather", "reduce_scatter", "barrier"]


def _by_rank(comms: list[pccl.Communicator]) -> list[pccl.Communicator]:
    return sorted(comms, key=lambda c: c.rank)


def launch(c: pccl.Communicator, kind: str, world: int, n: int, tag: int = 0,
           value: float = 1.0, restore: bool = False
           ) -> tuple[pccl.AllReduceHandle, list[np.ndarray]]:
    """Launch ``kind`` sized for ``world`` peers; its handle and its buffers."""
    x = np.full(n, value, np.float32)
    if kind == "broadcast":
        return c.broadcast_async(x, root=0, tag=tag, restore_on_abort=restore), [x]
    if kind == "all_gather":
        out = np.zeros(world * n, np.float32)
        return c.all_gather_async(x, out, tag=tag), [x, out]
    if kind == "reduce_scatter":
        src, out = np.full(world * n, value, np.float32), np.zeros(n, np.float32)
        return c.reduce_scatter_async(src, out, tag=tag), [src, out]
    return c.barrier_async(tag=tag), []


@pytest.mark.parametrize("kind", KINDS)
async def test_a_membership_change_before_the_start_fails_it_on_every_peer(peers, kind):
    a, b, c = _by_rank(await peers(3))
    launched = [launch(p, kind, 3, 1000, value=p.rank + 1.0) for p in (a, b)]
    await asyncio.sleep(0.05)  # lets the votes reach the master; no outcome depends on it
    testing.crash(c)  # c never launches; the master drops it and publishes a new ring
    for h, bufs in launched:
        with pytest.raises(pccl.PeerLostError, match="ring changed"):
            await h
        if kind == "broadcast":
            assert (bufs[0] == bufs[0][0]).all()  # as it was
    assert a.peer_group_world_size == b.peer_group_world_size == 2
    again = [launch(p, kind, 2, 1000, tag=1, value=p.rank + 1.0) for p in _by_rank([a, b])]
    infos = await asyncio.gather(*(h for h, _ in again))
    assert all(i.world_size == 2 for i in infos)
    if kind == "all_gather":
        assert all((bufs[1] == np.repeat([1.0, 2.0], 1000)).all() for _, bufs in again)
    await c.close()


@pytest.mark.parametrize(("left", "right", "words"), [
    (("broadcast", {"root": 0}), ("broadcast", {"root": 1}), ("from rank 0", "from rank 1")),
    (("all_gather", {}), ("reduce_scatter", {}), ("all-gather 4 x", "reduce-scatter 4 x")),
    (("broadcast", {"n": 4}), ("broadcast", {"n": 8}), ("broadcast 4 x", "broadcast 8 x")),
    (("reduce_scatter", {"op": pccl.ReduceOp.SUM}), ("reduce_scatter", {"op": pccl.ReduceOp.MAX}),
     ("float32 SUM", "float32 MAX")),
    (("reduce_scatter", {"dtype": np.float64}), ("reduce_scatter", {}),
     ("float64", "float32")),
    (("barrier", {}), ("all_gather", {}), ("barrier", "all-gather 4 x")),
])
async def test_peers_that_disagree_are_rejected_on_every_peer_naming_each(peers, left, right,
                                                                          words):
    a, b = _by_rank(await peers(2))

    def call(c: pccl.Communicator, kind: str, kw: dict) -> object:
        n, dt = kw.get("n", 4), kw.get("dtype", np.float32)
        x = np.ones(n, dt)
        if kind == "broadcast":
            return c.broadcast(x, root=kw.get("root", 0), tag=5)
        if kind == "all_gather":
            return c.all_gather(x, np.zeros(2 * n, dt), tag=5)
        if kind == "reduce_scatter":
            return c.reduce_scatter(np.ones(2 * n, dt), x, op=kw.get("op", pccl.ReduceOp.SUM),
                                    tag=5)
        return c.barrier(tag=5)

    res = await asyncio.gather(call(a, *left), call(b, *right), return_exceptions=True)
    for r in res:
        assert isinstance(r, pccl.InvalidUsageError), res
        assert all(w in str(r) for w in words), r
    await asyncio.gather(a.barrier(tag=5), b.barrier(tag=5))  # the tag is free again


@pytest.mark.parametrize("kind", ["broadcast", "all_gather", "reduce_scatter"])
async def test_a_barrier_beside_another_kind_is_a_deadlock_on_both_within_a_second(peers,
                                                                                  kind):
    a, b = _by_rank(await peers(2))
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    other, _ = launch(b, kind, 2, 16, tag=2)
    res = await asyncio.gather(a.barrier(tag=1), other.wait(), return_exceptions=True)
    assert all(isinstance(r, pccl.DeadlockError) for r in res), res
    assert loop.time() - t0 < 1.0


async def test_twenty_mixed_collectives_in_flight_at_once(peers):
    comms = _by_rank(await peers(3))
    kinds = [*KINDS, "all_reduce"] * 4  # 20 at once on every peer, all five kinds
    launched = []
    for tag, kind in enumerate(kinds):
        row = []
        for c in comms:
            if kind == "all_reduce":
                x = np.full(5000, c.rank + 1.0, np.float32)
                row.append((c.all_reduce_async(x, tag=tag), [x]))
            else:
                row.append(launch(c, kind, 3, 5000 + tag, tag=tag, value=c.rank + 1.0))
        launched.append((kind, row))
    assert all(len(testing.control_plane(c).colls) == 20 for c in comms)
    for kind, row in launched:
        await asyncio.gather(*(h for h, _ in row))
        for _, bufs in row:
            if kind == "all_reduce":
                assert (bufs[0] == 6).all()
            elif kind == "broadcast":
                assert (bufs[0] == 1).all()  # rank 0's
            elif kind == "all_gather":
                n = len(bufs[0])
                assert (bufs[1] == np.repeat([1.0, 2.0, 3.0], n)).all()
            elif kind == "reduce_scatter":
                assert (bufs[1] == 6).all()


async def test_a_repeated_collective_of_each_kind_starts_on_its_ticket(peers):
    comms = _by_rank(await peers(3))
    for tag, kind in enumerate(KINDS):  # (a ticket is the tag's, whatever its kind)
        for round_ in range(2):
            launched = [launch(c, kind, 3, 300_000, tag=tag, value=c.rank + 1.0)
                        for c in comms]
            early = [(c := testing.control_plane(p).colls[tag]).seq != 0 and not c.confirmed
                     for p in comms]
            assert early == [round_ > 0] * 3, (kind, round_)
            await asyncio.gather(*(h for h, _ in launched))
            if kind == "all_gather":
                assert all((b[1] == np.repeat([1.0, 2.0, 3.0], 300_000)).all()
                           for _, b in launched)


@pytest.mark.parametrize("kind", ["broadcast", "all_gather", "reduce_scatter"])
async def test_one_every_peer_finished_is_completed_by_the_next_master(kind):
    async with running(new_master()) as first:
        port = first.port
        comms = _by_rank(await join_peers(first, 3))
        _drop_completions(first, set())
        launched = [launch(c, kind, 3, 100_000, tag=4, value=c.rank + 1.0) for c in comms]
        while not all(h._coll.data_ok for h, _ in launched):  # their data is done ...
            await asyncio.sleep(0.01)  # polling a state, no outcome depends on the period
    # launched during the outage, in the old master's ring: they fail (retryable: the next
    # master's first membership is a new epoch, the ranks it gives may differ)
    outage = [launch(c, kind, 3, 1000, tag=6) for c in comms]
    async with running(new_master(port)):  # ... and the verdict comes from the next master
        infos = await asyncio.gather(*(h for h, _ in launched))
        assert all(i.world_size == 3 for i in infos)
        if kind == "broadcast":
            assert all((b[0] == 1).all() for _, b in launched)
        for h, _ in outage:
            with pytest.raises(pccl.PeerLostError):
                await h
        again = [launch(c, kind, 3, 1000, tag=6) for c in comms]  # the retry
        await asyncio.gather(*(h for h, _ in again))
    for c in comms:
        await c.close()


@pytest.mark.parametrize("restore", [True, False])
async def test_a_broadcast_not_every_peer_finished_is_aborted(restore):
    """Aborted by the next master: the root's tensor is as it was; the others' too with
    ``restore_on_abort=True`` (else they hold unspecified bytes, the root's in part)."""
    async with running(new_master()) as first:
        port = first.port
        comms = _by_rank(await join_peers(first, 3))
        testing.data_plane(comms[2]).abort()  # its data path breaks: nobody is told
        _drop_completions(first, set())
        launched = [launch(c, "broadcast", 3, 1 << 20, tag=2, value=c.rank + 1.0,
                           restore=restore) for c in comms]
        await asyncio.sleep(0.2)  # lets the attempt start; no outcome depends on it
    async with running(new_master(port)):
        for h, _ in launched:
            with pytest.raises(pccl.PeerLostError):
                await h
    tensors = [b[0] for _, b in launched]
    assert (tensors[0] == 1.0).all()  # the root's: only read
    if restore:
        assert (tensors[1] == 2.0).all() and (tensors[2] == 3.0).all()  # restored in place
    else:
        assert set(np.unique(tensors[1])) <= {1.0, 2.0}  # its own or the root's bytes
    for c in comms:
        await c.close()
