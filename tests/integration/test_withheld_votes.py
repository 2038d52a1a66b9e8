"""Issue 31, point 6: a member that heartbeats and never votes no longer stalls the run. The
master kicks a lone holdout after ``vote_timeout`` (a real master, real sockets; the insider
speaks the protocol through the library's own handshake and frames)."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

import pccl_aio as pccl
from pccl_aio._net.stream import read_frame
from pccl_aio._wire import messages as m
from pccl_aio._wire.framing import frame
from tests.helpers import SECRET, join_peers, raw_master, reduce_ok

pytestmark = pytest.mark.timeout(60)


async def _insider(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A member-to-be that says Hello and from then on only heartbeats."""
    reader, writer = await raw_master(port, SECRET)
    writer.write(frame(m.encode(m.Hello(m.PROTOCOL_VERSION, 0, 1))))
    return reader, writer


async def _heartbeats(writer: asyncio.StreamWriter) -> None:
    while not writer.is_closing():
        writer.write(frame(m.encode(m.Heartbeat())))
        await asyncio.sleep(0.2)  # its heartbeat interval, not a synchronisation


async def _kicked(reader: asyncio.StreamReader) -> str:
    """The reason of the ``Kicked`` the insider gets (messages before it are skipped)."""
    while True:
        msg = m.decode_master_to_peer(await read_frame(reader))
        if isinstance(msg, m.Kicked):
            return msg.reason


@pytest.mark.parametrize("timeout", [1.0, None])
async def test_a_member_that_only_heartbeats_is_kicked_after_the_vote_timeout(timeout):
    async with pccl.Master("127.0.0.1", 0, heartbeat_interval=0.2, heartbeat_timeout=10.0,
                           admission_interval=0.0, secret=SECRET, vote_timeout=timeout) as mst:
        comms = await join_peers(mst, 2, secret=SECRET, heartbeat_timeout=10.0)
        reader, writer = await _insider(mst.port)
        beats = asyncio.ensure_future(_heartbeats(writer))
        try:
            while not all(await asyncio.gather(*(c.are_peers_pending() for c in comms))):
                pass
            await asyncio.gather(*(c.update_topology() for c in comms))
            assert len(mst.state.accepted()) == 3  # the insider is a member now
            t0 = time.monotonic()
            votes = asyncio.gather(*(c.are_peers_pending() for c in comms))
            if timeout is None:  # the old behaviour, if asked for: the others wait
                done, _ = await asyncio.wait([votes], timeout=3.0)
                assert not done and len(mst.state.accepted()) == 3
                votes.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await votes
                return
            reason = await asyncio.wait_for(_kicked(reader), 5)
            assert "withheld are_peers_pending()" in reason and "vote_timeout" in reason
            await asyncio.wait_for(votes, 5)
            assert time.monotonic() - t0 < timeout + 2.0
            assert len(mst.state.accepted()) == 2
            await reduce_ok(comms)  # the group goes on
        finally:
            beats.cancel()
            writer.close()
            await asyncio.gather(*(c.close() for c in comms))
