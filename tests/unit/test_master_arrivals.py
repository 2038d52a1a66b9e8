"""The sans-IO master's word on joiners (``PeersWaiting``, what ``wait_for_peers`` waits on)
and the epoch of a topology round that admits nobody."""

from __future__ import annotations

from pccl_aio._master.core import state as ms
from pccl_aio._wire import messages as m
from tests.unit.master_harness import Harness, msgs


def harness() -> Harness:
    h = Harness()
    h.notices = True
    return h


def told(acts: list[ms.Action]) -> dict[int, list[bool]]:
    return {c: [x.waiting for x in v] for c, v in msgs(acts, m.PeersWaiting).items()}


def test_a_hundred_topology_votes_that_admit_nobody_leave_the_epoch_unchanged() -> None:
    h = harness()
    a, b = h.run(0, 0)
    epoch = h.st.epoch
    for _ in range(100):
        acts = h.send(a, m.VoteUpdateTopology()) + h.send(b, m.VoteUpdateTopology())
        assert msgs(acts, m.Membership) == {}
        assert set(msgs(acts, m.TopologyUpdated)) == {a, b}
    assert h.st.epoch == epoch
    p, _ = h.join(0)  # a round that admits someone is a ring change: one epoch more
    acts = h.send(a, m.VoteUpdateTopology()) + h.send(b, m.VoteUpdateTopology())
    assert h.st.epoch == epoch + 1 and set(msgs(acts, m.Membership)) == {a, b, p}


def test_members_are_told_once_a_joiner_is_heard_and_again_when_its_batch_is_taken() -> None:
    h = harness()
    a, b = h.run(0, 0)
    p, acts = h.join(0)
    assert told(acts) == {}  # a Hello alone is not a live joiner (limits.Admission)
    assert told(h.send(p, m.Heartbeat())) == {a: [True], b: [True]}
    assert told(h.send(p, m.Heartbeat())) == {}  # said once
    h.send(a, m.VotePeersPending())
    acts = h.send(b, m.VotePeersPending())
    assert msgs(acts, m.PeersPendingAnswer) == {a: [m.PeersPendingAnswer(True)],
                                                b: [m.PeersPendingAnswer(True)]}
    assert told(acts) == {a: [False], b: [False]}  # after the answer: the batch is taken
    acts = h.send(a, m.VoteUpdateTopology()) + h.send(b, m.VoteUpdateTopology())
    assert told(acts) == {} and h.st.accepted() == [a, b, p]


def test_the_next_batch_is_told_after_the_admission_interval_on_a_tick() -> None:
    h = harness()
    (a,) = h.run(0)
    p, _ = h.join(0)
    h.send(p, m.Heartbeat())
    h.send(a, m.VotePeersPending())  # the batch of p, at t = 0
    h.send(a, m.VoteUpdateTopology())
    q, _ = h.join(0)
    assert told(h.send(q, m.Heartbeat())) == {}  # within the interval (1 s): not due yet
    h.now = 0.5
    assert told(h.handle(ms.Tick(h.now))) == {}
    h.now = 1.0
    assert told(h.handle(ms.Tick(h.now))) == {a: [True], p: [True]}


def test_a_joiner_that_leaves_before_admission_is_told_away() -> None:
    h = harness()
    (a,) = h.run(0)
    p, _ = h.join(0)
    assert told(h.send(p, m.Heartbeat())) == {a: [True]}
    assert told(h.disconnect(p)) == {a: [False]}


def test_nobody_arriving_costs_the_members_nothing_but_heartbeats() -> None:
    h = harness()
    a, b = h.run(0, 0)
    for i in range(1, 21):
        h.now = i * 0.5
        h.send(a, m.Heartbeat())
        h.send(b, m.Heartbeat())
        acts = h.handle(ms.Tick(h.now))
        assert all(isinstance(x, ms.Send) and isinstance(x.msg, m.MasterHeartbeat)
                   for x in acts), acts


def test_a_member_admitted_while_joiners_are_due_learns_it() -> None:
    """The word stands when a peer becomes a member (or gets the membership again): it
    comes with the membership; a batch admitted by ``update_topology`` alone ends it."""
    h = harness()
    (a,) = h.run(0)
    p, _ = h.join(0)
    h.send(p, m.Heartbeat())
    acts = h.send(a, m.VoteUpdateTopology())
    assert told(acts) == {a: [False], p: [False]} and h.st.accepted() == [a, p]
    h.now = 5.0
    q, _ = h.join(0)
    acts = h.send(q, m.Heartbeat())
    assert told(acts) == {a: [True], p: [True]}
    acts = h.disconnect(p)  # a departure re-sends the membership: a member hears it again
    assert told(acts) == {a: [True]}
