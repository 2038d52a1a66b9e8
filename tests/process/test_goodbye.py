"""A peer process that closes its communicator is counted as leaving, never as a dead
connection: ``close()`` says goodbye and reads what the master still sends until the master
closes, because a close (or an exit) with unread bytes resets the connection, and the reset
can reach the master before the goodbye does (the demo then told 'killed (connection
dropped)' for a peer that had finished)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import pccl_aio as pccl
from tests.process.procs import Proc, spawn

PEER = Path(__file__).with_name("goodbye_peer.py")


@pytest.mark.timeout(120)
async def test_peers_that_close_and_exit_are_counted_as_leaving(procs: list[Proc]):
    # the master heartbeats every 5 ms, so bytes to the peer are in flight when it closes
    async with pccl.Master("127.0.0.1", 0, heartbeat_interval=0.005,
                           admission_interval=0.0) as master:
        for _ in range(4):
            batch = [await spawn(f"peer{i}", str(PEER), master.address, "6") for i in range(6)]
            procs.extend(batch)
            codes = await asyncio.wait_for(asyncio.gather(*(p.proc.wait() for p in batch)), 60)
            assert codes == [0] * 6, [await p.proc.stderr.read() for p in batch]
        # each peer's close waited for the master to close its connection: all counted
        departures = master.story.counts.departures
    assert departures == {"left": 24}, departures
