"""The peer's side of a withdrawn ``optimize_topology`` vote (no master: the control plane's
dispatch is fed the master's answers by hand, as in ``test_vote_withdrawal.py``)."""

from __future__ import annotations

import asyncio

import pytest

from pccl_aio._errors import DeadlockError, InvalidUsageError
from pccl_aio._wire import messages as m

from .test_vote_withdrawal import plane

pytestmark = pytest.mark.timeout(10)
DONE = m.TopologyOptimized(5, [1, 2], 2, 1e9)


async def test_a_cancelled_optimize_vote_is_taken_back_and_its_round_carried():
    cp, wire = plane()
    task = asyncio.ensure_future(cp.vote("optimize", m.VoteOptimize()))
    await wire.until(1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert wire.sent == [m.VoteOptimize(), m.WithdrawVote("optimize")]
    cp._dispatch(DONE)  # the others' votes came first: the round counted this one
    cp._dispatch(m.VoteWithdrawn("optimize"))
    assert await cp.vote("optimize", m.VoteOptimize()) == DONE  # no new round: in step
    assert wire.sent == [m.VoteOptimize(), m.WithdrawVote("optimize")]


@pytest.mark.parametrize("deadlock", [False, True])
async def test_a_rejected_optimize_vote_raises_a_typed_error(deadlock: bool):
    cp, wire = plane()
    task = asyncio.ensure_future(cp.vote("optimize", m.VoteOptimize()))
    await wire.until(1)
    cp._dispatch(m.MeasurePlan(1, m.PeerAddr(2, "127.0.0.1", 1), 0.5, 4))  # no hook: ignored
    cp._dispatch(m.VoteRejected("optimize", "no ring avoids 1->2", deadlock))
    with pytest.raises(DeadlockError if deadlock else InvalidUsageError,
                       match=r"optimize_topology\(\) failed: no ring"):
        await task
