"""Master failover in one process (issue 20; the real-process acceptance is
``tests/process/test_master_failover.py``): what a caller sees while the master is away,
operations in doubt completed or aborted by the next master, ``master_timeout``, run ids,
the choice among several master addresses, and argument checks."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import numpy as np
import pytest

import pccl_aio as pccl
from pccl_aio._master.core import state as ms
from pccl_aio._peer import testing
from pccl_aio._wire import messages as m
from tests.helpers import FAST, admit, join_peers, reduce_ok

pytestmark = pytest.mark.timeout(60)


def new_master(port: int = 0, **kw: object) -> pccl.Master:
    return pccl.Master("127.0.0.1", port, heartbeat_interval=0.2, heartbeat_timeout=2.0,
                       admission_interval=0.0, **kw)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def running(master: pccl.Master) -> AsyncIterator[pccl.Master]:
    await master.start()
    try:
        yield master
    finally:
        await master.close()


async def test_calls_wait_for_the_next_master_and_a_vote_in_doubt_is_retryable():
    """A joint vote waiting when the master is lost stays in doubt: the next master answers
    it if some member had the answer; here nobody had: ``MasterLostError``, call again."""
    async with running(new_master()) as first:
        port = first.port
        a, b = await join_peers(first, 2)
        vote = asyncio.ensure_future(a.update_topology())  # b never votes
        while not first.state.access.peer(a.peer_id).voted_topology:
            await asyncio.sleep(0.01)  # polling the master's state for the test
    xs = [np.full(1000, i + 1.0, np.float32) for i in range(2)]
    calls = [asyncio.ensure_future(c.all_reduce(x)) for c, x in zip((a, b), xs)]
    done, _ = await asyncio.wait([*calls, vote], timeout=0.3)
    assert not done  # no master: the calls wait, the vote is in doubt
    async with running(new_master(port)) as second:
        with pytest.raises(pccl.MasterLostError) as lost:  # retryable: a PeerLostError
            await vote
        assert not lost.value.new_member  # a member still: retry the call
        await asyncio.gather(*calls)
        assert all((x == 3.0).all() for x in xs)
        assert a.peer_id != b.peer_id and second.state.accepted() == sorted(
            [a.peer_id, b.peer_id])  # the same ids as before
        assert second.state.term == 2
        await asyncio.gather(a.close(), b.close())


async def test_a_call_made_during_the_outage_times_out_and_master_timeout_ends_it():
    async with running(new_master()) as first:
        a, b = await join_peers(first, 2, master_timeout=1.5)
    while testing.control_plane(a).up:
        await asyncio.sleep(0.01)  # until a saw the master go (polling a state)
    x = np.ones(4, np.float32)
    with pytest.raises(pccl.PcclTimeoutError):
        await a.all_reduce(x, timeout=0.3)
    assert (x == 1).all()
    with pytest.raises(pccl.MasterConnectionError, match="master_timeout"):
        await a.all_reduce(x)  # waits until master_timeout, then the session is over
    with pytest.raises(pccl.MasterConnectionError):
        await b.are_peers_pending()
    await asyncio.gather(a.close(), b.close())


def _drop_completions(master: pccl.Master, keep: set[int]) -> None:
    """The master dies between finishing a collective and telling its peers: its
    ``CollectiveComplete`` reaches only the peers in ``keep``."""
    apply = master._apply

    def filtered(actions: list[ms.Action]) -> None:
        apply([a for a in actions if not (isinstance(a, ms.Send) and isinstance(
            a.msg, m.CollectiveComplete) and a.conn not in keep)])

    master._apply = filtered  # type: ignore[method-assign]


@pytest.mark.parametrize("told", ["nobody", "one"])
async def test_a_collective_every_peer_finished_is_completed_by_the_next_master(told):
    async with running(new_master()) as first:
        port = first.port
        comms = await join_peers(first, 3)
        _drop_completions(first, {comms[0].peer_id} if told == "one" else set())
        xs = [np.full(100_000, i + 1.0, np.float32) for i in range(3)]
        hs = [c.all_reduce_async(x, tag=4) for c, x in zip(comms, xs)]
        waiting = [h for h, c in zip(hs, comms) if told == "nobody" or c is not comms[0]]
        while not all(h._coll.data_ok for h in waiting):  # their data is done ...
            await asyncio.sleep(0.01)  # polling a state, no outcome depends on the period
    async with running(new_master(port)):  # ... and the verdict comes from the next master
        infos = await asyncio.gather(*hs)
    assert all((x == 6.0).all() for x in xs)
    assert all(i.world_size == 3 for i in infos)
    for c in comms:
        await c.close()


async def test_a_collective_not_every_peer_finished_is_aborted_and_restored():
    async with running(new_master()) as first:
        port = first.port
        a, b, c = await join_peers(first, 3)
        testing.data_plane(c).abort()  # c's data path breaks: nobody finishes, nobody is told
        _drop_completions(first, set())
        xs = [np.full(1 << 20, i + 1.0, np.float32) for i in range(3)]
        hs = [p.all_reduce_async(x, tag=2) for p, x in zip((a, b, c), xs)]
        await asyncio.sleep(0.2)  # lets the attempt start; no outcome depends on it
    async with running(new_master(port)):
        for h in hs:
            with pytest.raises(pccl.PeerLostError):
                await h
    assert [x[0] for x in xs] == [1.0, 2.0, 3.0]  # restored in place
    for p in (a, b, c):
        await p.close()


async def test_a_peer_of_another_run_is_refused():
    async with running(new_master(run_id="run-b")) as master:
        comm = pccl.Communicator(master.address, run_id="run-a", **FAST)
        with pytest.raises(pccl.MasterConnectionError, match="run-a"):
            await comm.connect(attempts=1)
        await comm.close()
        ok = pccl.Communicator(master.address, run_id="run-b", **FAST)
        await ok.connect()
        await ok.close()


async def test_several_addresses_pick_the_master_serving_the_run():
    async with running(new_master()) as a_, running(new_master()) as b_:
        addrs = [b_.address, a_.address]  # b is listed first
        first = pccl.Communicator(a_.address, **FAST)
        await first.connect()  # the run is at a
        joiner = pccl.Communicator(addrs, **FAST)
        task = asyncio.ensure_future(joiner.connect())
        while not a_.state.pending():
            await asyncio.sleep(0.01)  # polling the master's state for the test
        await first.update_topology()
        await task
        assert b_.state.probe().members == 0 and a_.state.accepted() == sorted(
            [first.peer_id, joiner.peer_id])
        await first.close()
        await joiner.close()


@pytest.mark.parametrize("kw, match", [
    ({"master": []}, "list of 1-16"),
    ({"master": ["127.0.0.1:1", "nope"]}, "host:port"),
    ({"master_timeout": -1}, "master_timeout"),
    ({"master_timeout": True}, "master_timeout"),
    ({"run_id": "x" * 129}, "run_id"),
    ({"run_id": "a\nb"}, "run_id"),
])
def test_bad_failover_arguments_are_refused(kw, match):
    args = {"master": "127.0.0.1:1", **kw}
    with pytest.raises(pccl.InvalidUsageError, match=match):
        pccl.Communicator(args.pop("master"), **args)


@pytest.mark.parametrize("run_id", ["", "x" * 129, "a\tb", 5])
def test_a_master_refuses_a_bad_run_id(run_id):
    with pytest.raises(pccl.InvalidUsageError, match="run_id"):
        pccl.Master("127.0.0.1", 0, run_id=run_id)  # type: ignore[arg-type]


async def test_a_master_that_finds_the_run_at_a_higher_term_steps_down():
    """Split brain healed: master A serves two peers of run "r"; master B serves two others
    of the same run, and was restarted (term 2). A watches B (``others``), steps down, and
    its peers move to B, where the group admits them: one group. A vote waiting on A raises
    ``MasterLostError`` with ``new_member``."""
    async with running(new_master(run_id="r")) as b:
        port_b = b.port
        qs = await join_peers(b, 2, run_id="r")
    async with running(new_master(run_id="r", others=[f"127.0.0.1:{port_b}"])) as a:
        ps = [pccl.Communicator([a.address, f"127.0.0.1:{port_b}"], run_id="r", **FAST)
              for _ in range(2)]
        await ps[0].connect()
        await admit([ps[0]], ps[1])
        assert a.state.term == 1
        vote = asyncio.ensure_future(ps[0].are_peers_pending())  # ps[1] never votes
        async with running(new_master(port_b, run_id="r")) as b2:  # qs rejoin: term 2
            while sorted(b2.state.pending()) != sorted(p.peer_id for p in ps):
                await asyncio.sleep(0.05)  # polling: A steps down, its peers come to B
            assert a.state.accepted() == [] and a.state.term == 2
            # its membership did not survive: it goes on as a joiner, not with the retry
            with pytest.raises(pccl.MasterLostError, match="new member") as lost:
                await vote
            assert lost.value.new_member
            await asyncio.gather(*(q.update_topology() for q in qs))
            assert len(b2.state.accepted()) == 4 and b2.state.term == 2
            xs = [np.full(10, 1.0, np.float32) for _ in range(4)]
            await asyncio.gather(*(c.all_reduce(x) for c, x in zip([*qs, *ps], xs)))
            assert all((x == 4.0).all() for x in xs)
            for c in [*qs, *ps]:
                await c.close()


async def test_a_joiner_that_loses_its_master_again_rejoins_as_a_joiner():
    """Issue 31, point 8. ``a`` loses its connection, the run goes on without it and it
    rejoins as a joiner; its master is lost too before ``a`` is admitted. At the next master it
    must claim nothing of its old ring: before the fix it rejoined the rebuild "as a member",
    the all-reduce it launched meanwhile went out at its admission, and every peer of the
    group, in another call by then, got ``DeadlockError``."""
    async with running(new_master(recovery_grace=0.5)) as first:
        port = first.port
        a, b = await join_peers(first, 2)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        while loop.time() < t0 + 0.6:  # the run is no longer provisional (0.5 s): it is
            await reduce_ok([a, b])    # not given up for a's rejoin
        testing.control_plane(a).writer.transport.abort()  # (a's side: a cut, not a goodbye)
        while first.state.accepted() != [b.peer_id] or first.state.pending() == []:
            await asyncio.sleep(0.01)  # polling the master's state for the test
        cp = testing.control_plane(a)
        rejoin = cp.outage.hello_now(cp).rejoin  # what a would tell the next master
        assert rejoin is not None and not rejoin.accepted and not rejoin.seal
        x = np.ones(8, np.float32)
        launched = asyncio.ensure_future(a.all_reduce(x))  # waits: a is not a member
    async with running(new_master(port, recovery_grace=0.5)) as second:
        while sorted(second.state.accepted() + second.state.pending()) != sorted(
                [a.peer_id, b.peer_id]):
            await asyncio.sleep(0.01)  # polling the master's state for the test
        assert testing.control_plane(a).outage.as_joiner  # welcomed as a joiner, not a member
        while not await b.are_peers_pending():
            pass
        await b.update_topology()  # admits a
        with pytest.raises(pccl.MasterLostError) as lost:
            await launched
        assert lost.value.new_member
        infos = await asyncio.gather(*(c.sync_shared_state(pccl.SharedState(
            {"w": np.zeros(4, np.float32)}, revision=1)) for c in (a, b)))
        assert [i.revision for i in infos] == [1, 1]
        await asyncio.gather(a.close(), b.close())


async def test_a_call_retried_at_once_after_a_broken_connection_waits_instead_of_spinning(
        master):
    """Found by churn: a connection broken under a live session (a reset: the transport closes
    before the read loop runs) made every call raise ``MasterLostError`` without suspending,
    so a loop retrying at once never let the read loop notice the loss: it spun for seconds.
    Now the first such call starts the outage, and the retry waits for the next master."""
    a, b = await join_peers(master, 2)
    try:
        testing.control_plane(a).writer.transport.abort()  # a reset, seen by nobody yet
        raised = 0

        async def retry_at_once() -> None:
            nonlocal raised
            for _ in range(100):
                try:
                    await a.are_peers_pending()
                    return
                except pccl.MasterLostError:
                    raised += 1

        task = asyncio.ensure_future(retry_at_once())
        await asyncio.wait([task], timeout=1.0)  # b never votes: a retry that waits, waits
        assert raised == 1 and not task.done()
        task.cancel()
    finally:
        await asyncio.gather(a.close(), b.close())


async def test_a_sync_whose_fetch_outlives_its_master_is_not_reported_to_the_next():
    """Found by a clean-clone run: ``b`` is fetching the shared state when the master is
    lost, and the fetch ends only after ``b`` rejoined the next master. Its ``SyncDone`` went
    to that master, which knew no such sync and kicked ``b``. Now the loss already failed the
    sync for ``b`` (``MasterLostError``, retryable), nothing goes out, and the retry syncs."""
    async with running(new_master()) as first:
        port = first.port
        a, b = await join_peers(first, 2)
        fetching, release = testing.hold_fetches(b)
        ws = [np.full(64, v, np.float32) for v in (1.0, 0.0)]
        states = [pccl.SharedState({"w": w}, revision=r) for w, r in zip(ws, (3, 0))]
        calls = [asyncio.ensure_future(c.sync_shared_state(s)) for c, s in zip((a, b), states)]
        await fetching.wait()
    async with running(new_master(port)) as second:
        while sorted(second.state.accepted()) != sorted([a.peer_id, b.peer_id]):
            await asyncio.sleep(0.01)  # polling the master's state for the test
        release.set()
        with pytest.raises(pccl.MasterLostError) as lost:
            await calls[1]
        assert not lost.value.new_member
        with pytest.raises(pccl.SharedStateError):
            await calls[0]  # the next master: not every peer finished it
        infos = await asyncio.gather(*(c.sync_shared_state(s) for c, s in zip((a, b), states)))
        assert [i.revision for i in infos] == [3, 3] and (ws[1] == 1.0).all()
        assert sorted(second.state.accepted()) == sorted([a.peer_id, b.peer_id])
        await asyncio.gather(a.close(), b.close())
