"""Issue 20's acceptance with real processes: a DDP-like loop with shared state on three
peers (``state_worker.py ddp``) survives its master being SIGKILLed and restarted on the same
port, replaced by a master at the second listed address, SIGSTOPped for 8 s, lost while a
peer is killed and a joiner waits, and two masters up at once.

Every run checks: every peer finished; at every revision all peers report one state hash;
each peer's revisions are consecutive, each once (no step lost or repeated), and its step
counter (part of the state) equals the revision.
"""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import numpy as np
import pytest

import pccl_aio as pccl
from pccl_aio._peer import testing
from tests.process.ddp_run import Event, Run
from tests.process.procs import Proc, probe, start_master

pytestmark = pytest.mark.timeout(150)


async def three_peers(procs: list[Proc], addrs: str) -> Run:
    run = Run(procs, addrs)
    for i in range(3):
        await run.add(f"p{i}")
    return run


async def two_masters(procs: list[Proc]) -> tuple[Proc, int, int, Run]:
    """Masters A and B, and three peers given "A,B" (they join A, the first address)."""
    a, port_a = await start_master(procs, name="masterA")
    _, port_b = await start_master(procs, name="masterB")
    return a, port_a, port_b, await three_peers(procs, f"127.0.0.1:{port_a},127.0.0.1:{port_b}")


async def test_master_sigkilled_and_restarted_on_the_same_port(procs):
    master, port = await start_master(procs)
    run = await three_peers(procs, f"127.0.0.1:{port}")
    state: dict[str, Any] = {}

    async def events(ev: Event) -> None:
        if ev["revision"] >= 10 and not run.event_t:
            run.mark()
            master.signal(signal.SIGKILL)
            await master.proc.wait()
            await start_master(procs, port, "master2")  # about 0.5 s later: a fresh process
        elif run.event_t and ev["t"] > run.event_t and "after" not in state:
            state["after"] = await probe(port)

    await run.drive(events)
    run.check()
    assert (state["after"].term, state["after"].members) == (2, 3)  # rebuilt, a term up
    await run.close()


async def test_the_new_master_on_the_second_listed_address(procs):
    a, _, port_b, run = await two_masters(procs)
    state: dict[str, Any] = {}

    async def events(ev: Event) -> None:
        if ev["revision"] >= 10 and not run.event_t:
            run.mark()
            a.signal(signal.SIGKILL)
        elif run.event_t and ev["t"] > run.event_t and "b" not in state:
            state["b"] = await probe(port_b)

    await run.drive(events)
    run.check()
    assert (state["b"].term, state["b"].members) == (2, 3)  # the run moved to B, a term up
    await run.close()


async def test_master_sigstopped_for_8_s_and_resumed(procs):
    master, port = await start_master(procs)
    run = await three_peers(procs, f"127.0.0.1:{port}")
    state: dict[str, Any] = {}

    async def resume() -> None:
        await asyncio.sleep(8.0)  # the outage under test, not a synchronisation
        master.signal(signal.SIGCONT)
        state["resumed"] = time.time()

    async def events(ev: Event) -> None:
        if ev["revision"] >= 10 and not run.event_t:
            run.mark()
            master.signal(signal.SIGSTOP)
            run.pumps.append(asyncio.ensure_future(resume()))
        elif "resumed" in state and ev["t"] > state["resumed"] and "after" not in state:
            state["after"] = await probe(port)

    await run.drive(events)
    run.check()
    assert (state["after"].term, state["after"].members) == (2, 3)  # rebuilt, a term up
    await run.close()


async def test_a_peer_killed_and_a_joiner_waiting_during_the_outage(procs):
    master, port = await start_master(procs)
    run = await three_peers(procs, f"127.0.0.1:{port}")

    async def events(ev: Event) -> None:
        if ev["revision"] >= 10 and not run.event_t:
            run.mark()
            master.signal(signal.SIGKILL)
            run.kill("p1")
            await master.proc.wait()
            await run.add("joiner", wait_joined=False)  # retries connect() meanwhile
            await asyncio.sleep(1.0)  # the outage under test, not a synchronisation
            await start_master(procs, port, "master2")

    await run.drive(events)
    run.check()
    assert run.logs["joiner"][-1]["event"] == "finished"
    assert max(e.get("ws", 0) for e in run.logs["joiner"]) == 3  # trained with p0 and p2
    await run.close()


async def test_two_masters_up_at_once_end_in_one_group(procs):
    """Master A is SIGSTOPped: the peers move to B (term 2). A resumes: two masters are up.
    A joiner that can reach both joins B (the higher term), and A never serves a run again:
    one group, and every revision advanced once (one hash per revision, all peers)."""
    a, port_a, port_b, run = await two_masters(procs)
    state: dict[str, Any] = {}

    async def events(ev: Event) -> None:
        if ev["revision"] >= 8 and not run.event_t:
            run.mark()
            a.signal(signal.SIGSTOP)
        elif run.event_t and ev["t"] > run.event_t and "joined" not in state:
            state["joined"] = True  # the peers train with B now
            a.signal(signal.SIGCONT)
            state["a"] = await probe(port_a)  # A is up again, and has lost its peers
            state["b"] = await probe(port_b)
            await run.add("joiner")

    await run.drive(events)
    run.check(finishers=4)
    assert (state["a"].term, state["a"].members) == (1, 0)
    assert (state["b"].term, state["b"].members) == (2, 3)
    assert max(e.get("ws", 0) for e in run.logs["joiner"]) == 4  # with the three others
    await run.close()


async def test_a_master_that_stood_still_does_not_drop_the_peers_it_did_not_read(procs):
    """A master process SIGSTOPped for 2.5 s (past its 2 s heartbeat timeout, within the
    peers' 5 s): on resume it used to judge every peer silent before reading the heartbeats
    queued in its sockets, drop them all and rebuild the run. Now it reads first: nobody is
    dropped, no peer sees an outage, and the ring is the same."""
    master, port = await start_master(procs)
    comms = [pccl.Communicator(f"127.0.0.1:{port}", heartbeat_interval=0.2,
                               heartbeat_timeout=5.0) for _ in range(2)]
    try:
        await comms[0].connect()
        join = asyncio.ensure_future(comms[1].connect())
        while not await comms[0].are_peers_pending():
            pass
        await comms[0].update_topology()
        await join
        before = await probe(port)
        master.signal(signal.SIGSTOP)
        await asyncio.sleep(2.5)  # the stall under test, not a synchronisation
        master.signal(signal.SIGCONT)
        xs = [np.ones(1000, np.float32) for _ in comms]
        await asyncio.wait_for(asyncio.gather(*(c.all_reduce(x) for c, x in zip(comms, xs))),
                               10)
        assert all((x == 2).all() for x in xs)
        after = await probe(port)
        assert (after.term, after.members) == (before.term, 2)
        assert [testing.control_plane(c).outage.count for c in comms] == [0, 0]
    finally:
        await asyncio.gather(*(c.close() for c in comms))


async def test_a_frozen_peer_back_at_a_restarted_master_first_joins_again_as_new(procs):
    """p2 is SIGSTOPped until the master drops it (2 s) and p0, p1 go on without it; then p0
    and p1 are stopped too, the master is SIGKILLed and restarted, and p2 resumed: it reaches
    the new master first, claiming its old ring. The rebuilt run is p0's and p1's (their ring
    is newer), so the master tells p2 it is none of it and ends its session, and p2 joins
    again as a new member: it raises ``new_member`` once, receives the state, and trains on
    with the others (it used to go on believing it was a member)."""
    master, port = await start_master(procs)
    run = await three_peers(procs, f"127.0.0.1:{port}")
    p0, p1, p2 = (run.peers[n] for n in ("p0", "p1", "p2"))
    state: dict[str, Any] = {}

    async def events(ev: Event) -> None:
        if ev["revision"] >= 10 and ev["ws"] == 3 and not run.event_t:  # p2 in
            run.mark()
            p2.signal(signal.SIGSTOP)
        elif run.event_t and ev["ws"] == 2 and "master2" not in state:  # p2 was dropped
            for p in (p0, p1):
                p.signal(signal.SIGSTOP)
            master.signal(signal.SIGKILL)
            await master.proc.wait()
            state["master2"], _ = await start_master(procs, port, "master2",
                                                     env={"PCCL_TEST_LOG": "WARNING"})
            p2.signal(signal.SIGCONT)
            while (await probe(port)).term < 2:  # p2's rejoin made the run's term 2
                pass
            for p in (p0, p1):
                p.signal(signal.SIGCONT)

    await run.drive(events)
    run.check(rejoined=("p2",))
    later = [e for e in run.logs["p2"] if e["t"] > run.event_t]
    assert any("as a new member" in e.get("error", "") for e in later), run.story()
    # its links to the others were opened under its old id: they are not used under the new
    # one (a frame on one was another sender's to the receiver: an abort for everyone)
    assert "not from its sender" not in run.story(), run.story()
    assert max(e.get("ws", 0) for e in later) == 3  # trained with p0 and p1 again
    master2 = state["master2"]
    master2.signal(signal.SIGKILL)
    assert master2.proc.stderr is not None
    log = (await master2.proc.stderr.read()).decode()
    assert "of a run rebuilt without it" in log, log[-3000:]
    await run.close()
