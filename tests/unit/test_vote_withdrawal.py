"""The peer's side of a withdrawn vote, in the orders the network can deliver (no master:
the control plane's dispatch is fed the master's answers by hand)."""

from __future__ import annotations

import asyncio

import pytest

from pccl_aio._peer.control import ControlPlane
from pccl_aio._peer.core.config import PeerConfig
from pccl_aio._wire import messages as m
from pccl_aio._wire.framing import HEADER_SIZE

pytestmark = pytest.mark.timeout(10)


class Wire:
    """Stands in for the master connection's writer: records what the peer sends."""

    def __init__(self) -> None:
        self.sent: list[object] = []
        self._waits: list[tuple[int, asyncio.Future[None]]] = []

    def is_closing(self) -> bool:
        return False

    def write(self, data: bytes) -> None:
        self.sent.append(m.decode_peer_to_master(data[HEADER_SIZE:]))
        for n, fut in self._waits:
            if len(self.sent) >= n and not fut.done():
                fut.set_result(None)

    async def until(self, n: int) -> None:
        """Wait until ``n`` messages were sent in all."""
        if len(self.sent) < n:
            fut = asyncio.get_running_loop().create_future()
            self._waits.append((n, fut))
            await fut


def plane() -> tuple[ControlPlane, Wire]:
    cp = ControlPlane(PeerConfig(masters=(("127.0.0.1", 1),)), lambda ms: None)
    wire = Wire()
    cp._writer = wire  # type: ignore[assignment]
    cp._up = asyncio.get_running_loop().create_future()
    cp._up.set_result(None)  # a member of a live session
    return cp, wire


async def cancelled_vote(cp: ControlPlane, wire: Wire) -> None:
    task = asyncio.ensure_future(cp.vote("pending", m.VotePeersPending()))
    await wire.until(1)  # it sent its vote and waits
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_withdrawal_won_the_race_the_next_vote_gets_the_next_round():
    cp, wire = plane()
    await cancelled_vote(cp, wire)
    cp._dispatch(m.VoteWithdrawn("pending"))
    nxt = asyncio.ensure_future(cp.vote("pending", m.VotePeersPending()))
    await wire.until(3)
    cp._dispatch(m.PeersPendingAnswer(True))
    assert await nxt is True
    assert wire.sent == [m.VotePeersPending(), m.WithdrawVote("pending"), m.VotePeersPending()]


async def test_a_round_that_counted_the_withdrawn_vote_answers_the_next_vote_already_sent():
    """The others' votes reached the master before the withdrawal: that round counted it
    and they went on, so the next vote is that round's (its own copy is taken back)."""
    cp, wire = plane()
    await cancelled_vote(cp, wire)
    nxt = asyncio.ensure_future(cp.vote("pending", m.VotePeersPending()))
    await wire.until(3)
    cp._dispatch(m.PeersPendingAnswer(False))  # the round of the withdrawn vote
    assert await nxt is False
    assert wire.sent == [m.VotePeersPending(), m.WithdrawVote("pending"),
                         m.VotePeersPending(), m.WithdrawVote("pending")]
    cp._dispatch(m.VoteWithdrawn("pending"))
    cp._dispatch(m.VoteWithdrawn("pending"))
    last = asyncio.ensure_future(cp.vote("pending", m.VotePeersPending()))
    await wire.until(5)
    cp._dispatch(m.PeersPendingAnswer(True))
    assert await last is True


async def test_a_round_answer_before_the_next_vote_is_carried_to_it():
    cp, wire = plane()
    await cancelled_vote(cp, wire)
    cp._dispatch(m.PeersPendingAnswer(True))  # the withdrawn vote's round completed
    cp._dispatch(m.VoteWithdrawn("pending"))
    assert await cp.vote("pending", m.VotePeersPending()) is True  # no new round
    assert wire.sent == [m.VotePeersPending(), m.WithdrawVote("pending")]
