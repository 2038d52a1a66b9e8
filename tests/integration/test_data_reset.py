"""A data connection that closes or resets mid-collective fails it for the group at once."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

import pccl_aio as pccl
from pccl_aio._peer import testing

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("when", ["first", "last"])
@pytest.mark.parametrize("how", ["reset", "close"])
async def test_a_reset_data_connection_fails_the_collective_on_every_peer_at_once(
        peers, monkeypatch, how, when):
    """Cut at peer 1's first received segment (its predecessor is still sending) or at its
    next-to-last one (the predecessor has sent everything: only the receiving side can
    notice, and before the fix the group waited for the data deadline)."""
    from pccl_aio._peer.data import collective as _collective

    comms = await peers(3, data_timeout=30.0)  # the data deadline would take 30 s
    victim = comms[1]
    cut: list[float] = []
    seen = [0]
    on_segment = _collective.Collective.on_segment

    def spy(self, phase, off, length, p0, p1):
        on_segment(self, phase, off, length, p0, p1)
        if self.env is not testing.data_plane(victim) or cut:
            return
        seen[0] += 1
        if when == "first" or seen[0] == len(self.plan.expected()) - 1:
            cut.append(time.monotonic())
            receivers = testing.data_plane(victim).listener.conns  # its receive side, from peer 0
            for r in list(receivers):
                assert r._transport is not None
                if how == "reset":
                    r._transport.abort()  # an RST, as `ss -K` or a middlebox would send
                else:
                    r._transport.close()

    monkeypatch.setattr(_collective.Collective, "on_segment", spy)
    xs = [np.full(1 << 22, i + 1, np.float32) for i in range(3)]
    originals = [x.copy() for x in xs]
    results = await asyncio.gather(*(c.all_reduce(x) for c, x in zip(comms, xs)),
                                   return_exceptions=True)
    elapsed = time.monotonic() - cut[0]
    assert all(isinstance(r, pccl.PeerLostError) for r in results), results
    assert elapsed < 1.0, elapsed
    for x, o in zip(xs, originals):
        assert x.tobytes() == o.tobytes()
    monkeypatch.undo()
    infos = await asyncio.gather(*(c.all_reduce(x) for c, x in zip(comms, xs)))  # the retry
    assert all(i.world_size == 3 for i in infos)
    assert all((x == 6).all() for x in xs)
