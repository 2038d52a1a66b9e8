"""The peer's side of a withdrawn or rejected ``optimize_topology`` vote: the master's
messages go through ``dispatch`` into the vote book of a stand-in control plane (the
``dispatch.Plane`` interface; no master, no socket), as in ``test_vote_withdrawal.py``."""

from __future__ import annotations

from typing import Any

import pytest

from pccl_aio._errors import DeadlockError, InvalidUsageError
from pccl_aio._net.tasks import TaskSet
from pccl_aio._peer.core.config import PeerConfig
from pccl_aio._peer.data.core.stash import Stash
from pccl_aio._peer.data.core.tickets import Tickets
from pccl_aio._peer.session.arrivals import Arrivals
from pccl_aio._peer.session.core.votes import Carried, Settle, VoteBook, Withdraw
from pccl_aio._peer.session.dispatch import dispatch
from pccl_aio._peer.session.failover import Outage
from pccl_aio._wire import messages as m

from .test_vote_withdrawal import Caller, cancelled, play

pytestmark = pytest.mark.timeout(10)
DONE = m.TopologyOptimized(5, [1, 2], 2, 1e9)


class Plane:
    """What ``dispatch`` reads and changes of a control plane; records what it settles."""

    def __init__(self) -> None:
        self.membership: m.Membership | None = None
        self.term, self.run_id, self.peer_id = 0, "", 1
        self.config = PeerConfig(masters=(("127.0.0.1", 1),))
        self.colls: dict[int, Any] = {}
        self.tickets = Tickets(Stash())
        self.arrivals = Arrivals()
        self.outage = Outage(TaskSet("test"))
        self.votes: VoteBook[Caller] = VoteBook()
        self.on_measure: Any = lambda plan: None
        self.settled: list[Settle[Any] | Withdraw] = []

    def settle(self, actions: list[Settle[Any] | Withdraw]) -> None:
        self.settled += actions

    def admitted(self, msg: m.Membership) -> None:
        pass


def test_a_cancelled_optimize_vote_is_taken_back_and_its_round_carried():
    plane = Plane()
    play(cancelled("optimize", Caller("a")), plane.votes)  # WithdrawVote("optimize") sent
    assert dispatch(plane, DONE) is None  # the others' votes came first: it counted this one
    assert dispatch(plane, m.VoteWithdrawn("optimize")) is None
    assert plane.settled == []
    assert plane.votes.open("optimize") == Carried(DONE)  # no new round: in step


@pytest.mark.parametrize("deadlock", [False, True])
def test_a_rejected_optimize_vote_raises_a_typed_error(deadlock: bool):
    plane, a = Plane(), Caller("a")
    plane.votes.cast("optimize", a)
    dispatch(plane, m.MeasurePlan(1, m.PeerAddr(2, "127.0.0.1", 1), 0.5, 4))  # no hook: ignored
    assert plane.settled == []
    dispatch(plane, m.VoteRejected("optimize", "no ring avoids 1->2", deadlock))
    [act] = plane.settled
    assert isinstance(act, Settle) and act.waiter is a and act.error is not None
    assert type(act.error) is (DeadlockError if deadlock else InvalidUsageError)
    with pytest.raises(DeadlockError if deadlock else InvalidUsageError,
                       match=r"optimize_topology\(\) failed: no ring"):
        raise act.error
