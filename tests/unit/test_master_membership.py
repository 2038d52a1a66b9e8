"""Membership and the joint votes of the sans-IO master: joining, admission by topology
vote, the peers-pending vote, conflicting phases, withdrawn votes, departures during votes,
and peer groups. Harness: ``master_harness``.
"""

from __future__ import annotations

import pytest

from pccl_aio._master.core import state as ms
from pccl_aio._wire import messages as m
from tests.unit.master_harness import (
    DEPARTURES,
    RUN,
    Harness,
    closes,
    departure,
    index_of,
    msgs,
    ring_ids,
    run_with_silent,
    sent_to,
    welcome,
)

# ---- join / accept ------------------------------------------------------------------------------


def test_first_peer_is_accepted_at_once() -> None:
    h = Harness()
    a = h.connect()
    acts = h.hello(a, group=0, port=5555)
    assert acts == [
        ms.Send(a, welcome(a, True)),
        ms.Send(a, m.Membership(1, 1, 1, 1, [m.PeerAddr(a, "127.0.0.1", 5555)], term=1)),
    ]
    assert h.st.accepted() == [a]
    assert h.st.pending() == []
    assert h.st.epoch == 1


def test_connection_without_hello_is_not_a_peer() -> None:
    h = Harness()
    h.connect()
    assert h.st.accepted() == [] and h.st.pending() == []
    b, acts = h.join()
    assert sent_to(acts, b, m.Welcome) == [welcome(b, True)]


def test_later_peers_wait_pending_and_get_nothing_else() -> None:
    h = Harness()
    (a,) = h.run(0)
    b, acts = h.join(0)
    assert acts == [ms.Send(b, welcome(b, False))]
    c, acts = h.join(1)
    assert acts == [ms.Send(c, welcome(c, False))]
    assert h.st.accepted() == [a]
    assert h.st.pending() == [b, c]
    assert h.st.epoch == 1


def test_topology_vote_admits_pending_peers_once_every_accepted_peer_voted() -> None:
    h = Harness()
    a, b = h.run(0, 0)
    epoch = h.st.epoch
    c, _ = h.join(0)
    d, _ = h.join(0)
    assert h.send(a, m.VoteUpdateTopology()) == []
    assert h.st.pending() == [c, d]
    acts = h.send(b, m.VoteUpdateTopology())
    assert h.st.epoch == epoch + 1
    assert h.st.accepted() == [a, b, c, d] and h.st.pending() == []
    memb = msgs(acts, m.Membership)
    assert sorted(memb) == [a, b, c, d]
    for conn in (a, b, c, d):
        (mm,) = memb[conn]
        assert mm.epoch == epoch + 1
        assert mm.global_world_size == 4 and mm.num_groups == 1
        assert mm.largest_group_world_size == 4
        assert ring_ids(mm) == [a, b, c, d]
        assert mm.ring[2] == m.PeerAddr(c, "127.0.0.1", 40000 + c)
    # only the voters get the vote's answer, after their new membership
    assert msgs(acts, m.TopologyUpdated) == {a: [m.TopologyUpdated(epoch + 1)],
                                            b: [m.TopologyUpdated(epoch + 1)]}
    for conn in (a, b):
        assert index_of(acts, conn, m.Membership) < index_of(acts, conn, m.TopologyUpdated)
    assert closes(acts) == []


def test_topology_vote_without_pending_peers_still_answers_and_can_repeat() -> None:
    """A round that admits nobody is answered, changes no epoch and sends no membership (an
    epoch is a ring change: tickets stay valid)."""
    h = Harness()
    a, b = h.run(0, 0)
    epoch = h.st.epoch
    for _ in range(3):
        assert h.send(b, m.VoteUpdateTopology()) == []
        acts = h.send(a, m.VoteUpdateTopology())
        assert h.st.epoch == epoch
        assert msgs(acts, m.Membership) == {}
        assert msgs(acts, m.TopologyUpdated) == {a: [m.TopologyUpdated(epoch)],
                                                b: [m.TopologyUpdated(epoch)]}


def test_single_accepted_peer_admits_on_its_own_vote() -> None:
    h = Harness()
    (a,) = h.run(0)
    b, _ = h.join(0)
    acts = h.send(a, m.VoteUpdateTopology())
    assert [ring_ids(x) for x in sent_to(acts, b, m.Membership)] == [[a, b]]
    assert sent_to(acts, b, m.TopologyUpdated) == []
    assert len(sent_to(acts, a, m.TopologyUpdated)) == 1


def test_topology_vote_is_global_across_peer_groups() -> None:
    h = Harness()
    a, b = h.run(0, 1)
    c, _ = h.join(1)
    assert h.send(a, m.VoteUpdateTopology()) == []  # b (other group) has not voted yet
    assert h.st.pending() == [c]
    acts = h.send(b, m.VoteUpdateTopology())
    assert h.st.pending() == []
    memb = msgs(acts, m.Membership)
    assert ring_ids(memb[a][0]) == [a]
    assert ring_ids(memb[b][0]) == ring_ids(memb[c][0]) == [b, c]


def test_membership_rings_are_ascending_peer_ids_and_use_advertised_host() -> None:
    h = Harness()
    # 10.0.0.2 announces another host
    h.st = ms.MasterState(allow_any_advertise_host=True, run_id=RUN)
    a, _ = h.join(0, host="10.0.0.1")
    b, _ = h.join(0, host="10.0.0.2", advertise_host="10.9.9.9")
    acts = h.send(a, m.VoteUpdateTopology())
    (mm,) = sent_to(acts, b, m.Membership)
    assert mm.ring == [m.PeerAddr(a, "10.0.0.1", 40000 + a), m.PeerAddr(b, "10.9.9.9", 40000 + b)]


# ---- peers-pending vote -------------------------------------------------------------------------


def test_peers_pending_vote_answers_false_with_nobody_waiting() -> None:
    h = Harness()
    a, b, c = h.run(0, 0, 1)
    assert h.send(a, m.VotePeersPending()) == []
    assert h.send(c, m.VotePeersPending()) == []  # scope: every accepted peer, all groups
    acts = h.send(b, m.VotePeersPending())
    assert acts == [ms.Send(x, m.PeersPendingAnswer(False)) for x in (a, b, c)]


def test_peers_pending_vote_answers_true_when_a_peer_waits_then_topology_admits_it() -> None:
    h = Harness()
    a, b = h.run(0, 0)
    p, _ = h.join(0)
    h.send(p, m.Heartbeat())  # a joiner counts once heard from after its Hello
    assert h.send(b, m.VotePeersPending()) == []
    acts = h.send(a, m.VotePeersPending())
    assert msgs(acts, m.PeersPendingAnswer) == {a: [m.PeersPendingAnswer(True)],
                                               b: [m.PeersPendingAnswer(True)]}
    assert sent_to(acts, p) == []
    h.vote_topology_all()
    assert h.st.accepted() == [a, b, p]
    # the vote resets: a second round is legal and now needs the newcomer too
    assert h.send(a, m.VotePeersPending()) == []
    assert h.send(b, m.VotePeersPending()) == []
    acts = h.send(p, m.VotePeersPending())
    assert msgs(acts, m.PeersPendingAnswer) == {x: [m.PeersPendingAnswer(False)] for x in (a, b, p)}


def test_single_accepted_peer_gets_its_pending_answer_at_once() -> None:
    h = Harness()
    (a,) = h.run(0)
    assert h.send(a, m.VotePeersPending()) == [ms.Send(a, m.PeersPendingAnswer(False))]
    p, _ = h.join(0)
    h.send(p, m.Heartbeat())  # a joiner counts once heard from after its Hello
    assert h.send(a, m.VotePeersPending()) == [ms.Send(a, m.PeersPendingAnswer(True))]


def test_peers_pending_vote_is_orthogonal_to_collectives() -> None:
    h = Harness()
    a, b = h.run(0, 0)
    seq = h.start([a, b], 1)
    h.send(a, m.VotePeersPending())
    acts = h.send(b, m.VotePeersPending())
    assert len(msgs(acts, m.PeersPendingAnswer)) == 2
    h.send(a, m.CollectiveDone(1, seq, True))
    acts = h.send(b, m.CollectiveDone(1, seq, True))
    assert len(msgs(acts, m.CollectiveComplete)) == 2


# ---- conflicting phases: topology votes are withdrawn --------------------------------------------


def _vote_rejected(acts: list[ms.Action]) -> list[int]:
    out = []
    for x in acts:
        if isinstance(x, ms.Send) and isinstance(x.msg, m.VoteRejected):
            assert x.msg.kind == "topology" and "update_topology" in x.msg.reason
            out.append(x.conn)
    return out


@pytest.mark.parametrize("topology_first", [True, False])
def test_topology_vote_next_to_a_pending_vote_is_withdrawn(topology_first: bool) -> None:
    h = Harness()
    a, b, c = h.run(0, 0, 1)
    p, _ = h.join(0)
    h.send(p, m.Heartbeat())  # a joiner counts once heard from after its Hello
    if topology_first:
        assert h.send(a, m.VoteUpdateTopology()) == []
        acts = h.send(b, m.VotePeersPending())
    else:
        assert h.send(b, m.VotePeersPending()) == []
        acts = h.send(a, m.VoteUpdateTopology())
    assert _vote_rejected(acts) == [a] and len(acts) == 1
    # a's topology vote is gone (voting again is legal), b's pending vote still stands
    h.send(a, m.VotePeersPending())
    acts = h.send(c, m.VotePeersPending())
    assert msgs(acts, m.PeersPendingAnswer) == {x: [m.PeersPendingAnswer(True)] for x in (a, b, c)}
    acts = h.vote_topology_all()
    assert _vote_rejected(acts) == [] and h.st.accepted() == [a, b, c, p]


@pytest.mark.parametrize("topology_first", [True, False])
def test_topology_vote_next_to_a_voting_collective_is_withdrawn(topology_first: bool) -> None:
    h = Harness()
    a, b, x, y = h.run(0, 0, 1, 1)
    if topology_first:
        h.send(a, m.VoteUpdateTopology())
        assert h.send(x, m.VoteUpdateTopology()) == []
        # a launch is no conflict yet: its caller may await it next (then all would deadlock)
        assert h.send(y, m.CollectiveInit(1, 8, 10, 0)) == []  # another group's counts too
        acts = h.send(b, m.VoteUpdateTopology())  # checked at the next vote
        assert _vote_rejected(acts) == [a, b, x]
    else:
        h.send(y, m.CollectiveInit(1, 8, 10, 0))
        acts = h.send(a, m.VoteUpdateTopology())
        assert _vote_rejected(acts) == [a]
    assert msgs(acts, m.CollectiveStart) == {}
    assert sorted(msgs(h.send(x, m.CollectiveInit(1, 8, 10, 0)), m.CollectiveStart)) == [x, y]
    # group 0 never voted for tag 1: a may launch collectives again (its vote is withdrawn)
    assert sorted(msgs(h.init([a, b], 1), m.CollectiveStart)) == [a, b]


def test_topology_vote_waits_for_peers_in_a_running_collective() -> None:
    h = Harness()
    a, b, x, y = h.run(0, 0, 1, 1)
    seq = h.start([x, y], 1)
    assert h.send(a, m.VoteUpdateTopology()) == []
    assert h.send(b, m.VoteUpdateTopology()) == []  # no conflict: x, y are busy, not voting
    h.send(x, m.CollectiveDone(1, seq, True))
    assert sorted(msgs(h.send(y, m.CollectiveDone(1, seq, True)), m.CollectiveComplete)) == [x, y]
    h.send(x, m.VoteUpdateTopology())
    acts = h.send(y, m.VoteUpdateTopology())
    assert sorted(msgs(acts, m.TopologyUpdated)) == [a, b, x, y]


# ---- withdrawn votes: the caller cancelled update_topology() / are_peers_pending() -------------


def ack(conn: int, kind: str) -> list[ms.Action]:
    """The master's only reply to a registered peer's WithdrawVote."""
    return [ms.Send(conn, m.VoteWithdrawn(kind))]  # type: ignore[arg-type]


def test_withdrawn_topology_vote_frees_the_peer_for_a_collective() -> None:
    """Regression: a cancelled update_topology() left its vote counted, so the peer's next
    CollectiveInit was kicked with "collective tag 1 already running"."""
    h = Harness()
    a, b = h.run(0, 0)
    assert h.send(a, m.VoteUpdateTopology()) == []
    assert h.send(a, m.WithdrawVote("topology")) == ack(a, "topology")
    assert h.send(a, m.CollectiveInit(1, 8, 10, 0)) == []  # not kicked
    acts = h.send(b, m.CollectiveInit(1, 8, 10, 0))
    assert closes(acts) == [] and msgs(acts, m.VoteRejected) == {}
    starts = msgs(acts, m.CollectiveStart)
    assert sorted(starts) == [a, b]
    seq = starts[a][0].seq
    h.send(a, m.CollectiveDone(1, seq, True))
    assert sorted(msgs(h.send(b, m.CollectiveDone(1, seq, True)), m.CollectiveComplete)) == [a, b]
    assert h.st.accepted() == [a, b]


def test_withdrawn_topology_vote_no_longer_counts_until_the_peer_votes_again() -> None:
    h = Harness()
    a, b, c = h.run(0, 0, 1)
    p, _ = h.join(0)
    epoch = h.st.epoch
    assert h.send(a, m.VoteUpdateTopology()) == []
    assert h.send(b, m.VoteUpdateTopology()) == []
    assert h.send(a, m.WithdrawVote("topology")) == ack(a, "topology")
    assert h.send(c, m.VoteUpdateTopology()) == []  # b and c voted, a withdrew: p waits
    assert h.st.pending() == [p] and h.st.epoch == epoch
    acts = h.send(a, m.VoteUpdateTopology())  # voting again is legal, not a duplicate
    assert closes(acts) == [] and h.st.accepted() == [a, b, c, p]
    assert msgs(acts, m.TopologyUpdated) == {x: [m.TopologyUpdated(epoch + 1)] for x in (a, b, c)}


def test_withdrawn_pending_vote_no_longer_counts_until_the_peer_votes_again() -> None:
    h = Harness()
    a, b, c = h.run(0, 0, 1)
    p, _ = h.join(0)
    h.send(p, m.Heartbeat())  # a joiner counts once heard from after its Hello
    assert h.send(a, m.VotePeersPending()) == []
    assert h.send(a, m.WithdrawVote("pending")) == ack(a, "pending")
    assert h.send(b, m.VotePeersPending()) == []
    assert h.send(c, m.VotePeersPending()) == []  # a's vote is gone: no answer yet
    acts = h.send(a, m.VotePeersPending())
    assert acts == [ms.Send(x, m.PeersPendingAnswer(True)) for x in (a, b, c)]


@pytest.mark.parametrize("kind", ["topology", "pending"])
def test_withdraw_after_the_vote_completed_is_ignored(kind: str) -> None:
    """The answer and the withdrawal crossed: the finished vote stays finished."""
    h = Harness()
    a, b = h.run(0, 0)
    h.join(0)
    vote = m.VoteUpdateTopology() if kind == "topology" else m.VotePeersPending()
    answer = m.TopologyUpdated if kind == "topology" else m.PeersPendingAnswer
    h.send(b, vote)
    assert sorted(msgs(h.send(a, vote), answer)) == [a, b]
    epoch, accepted = h.st.epoch, h.st.accepted()
    assert h.send(a, m.WithdrawVote(kind)) == ack(a, kind)
    assert h.st.epoch == epoch and h.st.accepted() == accepted
    # the next round is a fresh one: it needs every vote again, and a's counts
    voters = h.st.accepted()
    for x in voters[:-1]:
        assert h.send(x, vote) == []
    assert sorted(msgs(h.send(voters[-1], vote), answer)) == voters


@pytest.mark.parametrize("kind", ["topology", "pending"])
def test_withdraw_without_a_counted_vote_is_ignored_and_never_kicks(kind: str) -> None:
    h = Harness()
    a, b = h.run(0, 0)
    p, _ = h.join(0)
    u = h.connect()
    for conn in (a, b, p, u):  # never voted; pending; no Hello yet (no acknowledgement)
        assert h.send(conn, m.WithdrawVote(kind)) == ([] if conn == u else ack(conn, kind))
    assert h.st.accepted() == [a, b] and h.st.pending() == [p]
    assert sent_to(h.hello(u), u) == [welcome(u, False)]
    # a's vote of the other kind is untouched: b's vote completes it
    other, answer = ((m.VotePeersPending(), m.PeersPendingAnswer) if kind == "topology"
                     else (m.VoteUpdateTopology(), m.TopologyUpdated))
    assert h.send(a, other) == []
    assert h.send(a, m.WithdrawVote(kind)) == ack(a, kind)
    assert sorted(msgs(h.send(b, other), answer)) == [a, b]


def test_withdraw_of_a_topology_vote_the_master_already_rejected_is_ignored() -> None:
    h = Harness()
    a, b = h.run(0, 0)
    h.send(a, m.VoteUpdateTopology())
    acts = h.send(b, m.VotePeersPending())  # conflicting phases: a's vote is withdrawn
    assert [type(x) for x in sent_to(acts, a)] == [m.VoteRejected]
    assert h.send(a, m.WithdrawVote("topology")) == ack(a, "topology")
    assert msgs(h.send(a, m.VotePeersPending()), m.PeersPendingAnswer) == {
        a: [m.PeersPendingAnswer(False)], b: [m.PeersPendingAnswer(False)]}


@pytest.mark.parametrize("how", DEPARTURES)
def test_departure_during_topology_vote_lets_the_remaining_voters_complete(how: str) -> None:
    h = Harness()
    a, b, c = run_with_silent(h, (0, 0, 1), 2)
    p, _ = h.join(0)
    h.send(a, m.VoteUpdateTopology())
    h.send(b, m.VoteUpdateTopology())
    epoch = h.st.epoch
    acts = departure(h, how, c)
    assert h.st.accepted() == [a, b, p] and h.st.pending() == []
    assert h.st.epoch == epoch + 2
    assert [ring_ids(x) for x in sent_to(acts, a, m.Membership)] == [[a, b], [a, b, p]]
    assert [ring_ids(x) for x in sent_to(acts, p, m.Membership)] == [[a, b, p]]
    assert msgs(acts, m.TopologyUpdated) == {a: [m.TopologyUpdated(epoch + 2)],
                                            b: [m.TopologyUpdated(epoch + 2)]}


@pytest.mark.parametrize("how", DEPARTURES)
def test_departure_during_pending_vote_lets_the_remaining_voters_complete(how: str) -> None:
    h = Harness()
    a, b = run_with_silent(h, (0, 0), 1)
    h.send(a, m.VotePeersPending())
    acts = departure(h, how, b)
    assert msgs(acts, m.PeersPendingAnswer) == {a: [m.PeersPendingAnswer(False)]}


@pytest.mark.parametrize("how", ["disconnect", "leave", "malformed"])
def test_departure_of_a_pending_peer_is_silent_and_it_is_never_admitted(how: str) -> None:
    h = Harness()
    a, b = h.run(0, 0)
    p, _ = h.join(0)
    epoch = h.st.epoch
    acts = departure(h, how, p)
    assert acts == []
    assert h.st.epoch == epoch and h.st.pending() == []
    acts = h.vote_topology_all()
    assert h.st.accepted() == [a, b]
    assert msgs(acts, m.Membership) == {} and h.st.epoch == epoch  # nobody was admitted
    assert set(msgs(acts, m.TopologyUpdated)) == {a, b}
    h.send(a, m.VotePeersPending())
    assert msgs(h.send(b, m.VotePeersPending()), m.PeersPendingAnswer)[a] == [
        m.PeersPendingAnswer(False)]


def test_idle_departure_rebroadcasts_membership_to_all_groups() -> None:
    h = Harness()
    a, b, c, d = h.run(0, 0, 1, 1)
    epoch = h.st.epoch
    acts = h.disconnect(b)
    assert [x.conn for x in acts] == [a, c, d]
    assert all(isinstance(x.msg, m.Membership) and x.msg.epoch == epoch + 1 for x in acts)
    mm = {x.conn: x.msg for x in acts}
    assert ring_ids(mm[a]) == [a] and ring_ids(mm[c]) == [c, d]
    assert (mm[a].global_world_size, mm[a].num_groups, mm[a].largest_group_world_size) == (3, 2, 2)
    assert h.disconnect(b) == []  # the transport reports the close again: no-op


def test_leave_closes_and_is_a_departure() -> None:
    h = Harness()
    a, b = h.run(0, 0)
    acts = h.send(b, m.Leave())
    assert acts[0] == ms.Close(b, acts[0].reason)
    assert [(x.conn, type(x.msg)) for x in acts[1:]] == [(a, m.Membership)]
    assert h.st.accepted() == [a]


def test_events_for_unknown_connections_are_ignored() -> None:
    h = Harness()
    (a,) = h.run(0)
    assert h.handle(ms.Received(99, m.VoteUpdateTopology(), 0.0)) == []
    assert h.handle(ms.Disconnected(99, 0.0)) == []
    assert h.st.accepted() == [a]


def test_all_accepted_leave_then_a_new_peer_is_accepted_at_once() -> None:
    h = Harness()
    a, b = h.run(0, 0)
    h.send(a, m.Leave())
    h.send(b, m.Leave())  # goodbyes: nobody will rejoin
    c, acts = h.join(0)
    assert sent_to(acts, c, m.Welcome) == [welcome(c, True)]
    (mm,) = sent_to(acts, c, m.Membership)
    assert ring_ids(mm) == [c] and mm.epoch == h.st.epoch


def test_all_accepted_vanish_then_a_new_peer_waits_the_grace_for_them() -> None:
    """The members vanished without a goodbye (killed, or cut off from a master that was
    frozen): they may rejoin (failover), so a new peer is a joiner until ``grace`` passed."""
    h = Harness()
    a, b = h.run(0, 0)
    h.disconnect(a)
    h.disconnect(b)
    c, acts = h.join(0)
    assert sent_to(acts, c, m.Welcome) == [welcome(c, False)] and h.st.accepted() == []
    h.now = 4.9
    h.send(c, m.Heartbeat())
    assert h.tick(4.9) and h.st.accepted() == []
    acts = h.tick(5.0)
    (mm,) = sent_to(acts, c, m.Membership)
    assert ring_ids(mm) == [c] and h.st.accepted() == [c]


@pytest.mark.parametrize("goodbye", [True, False])
def test_pending_peer_is_admitted_when_the_last_accepted_peer_departs(goodbye: bool) -> None:
    h = Harness()
    (a,) = h.run(0)
    p, _ = h.join(0)
    if goodbye:
        h.send(a, m.Leave())
    else:
        h.disconnect(a)  # it may rejoin: the grace first
        assert h.st.accepted() == []
        h.now = 5.0
        h.send(p, m.Heartbeat())
        h.tick(5.0)
    # Nobody can ever vote for p now; it should become the run's (first) accepted peer
    # instead of waiting in connect() until some unrelated newcomer arrives.
    assert h.st.accepted() == [p]


# ---- peer groups --------------------------------------------------------------------------------


def test_peer_groups_have_their_own_rings_and_counts() -> None:
    h = Harness()
    a, b = h.run(0, 0)
    x, _ = h.join(1)
    y, _ = h.join(1)
    z, _ = h.join(1)
    acts = h.vote_topology_all()
    for conn, ring in ((a, [a, b]), (b, [a, b]), (x, [x, y, z]), (y, [x, y, z]), (z, [x, y, z])):
        (mm,) = sent_to(acts, conn, m.Membership)
        assert ring_ids(mm) == ring
        assert (mm.global_world_size, mm.num_groups, mm.largest_group_world_size) == (5, 2, 3)


def test_collectives_of_one_group_do_not_wait_for_the_other() -> None:
    h = Harness()
    a, b, x, y = h.run(0, 0, 1, 1)
    h.send(x, m.CollectiveInit(1, 99, 5, 1))  # its own descriptor, its own consensus
    acts = h.init([a, b], 1)
    assert sorted(msgs(acts, m.CollectiveStart)) == [a, b]
    acts = h.send(y, m.CollectiveInit(1, 99, 5, 1))
    assert sorted(msgs(acts, m.CollectiveStart)) == [x, y]


def test_large_peer_group_ids_are_accepted() -> None:
    h = Harness()
    a, b = h.run(2**32 - 1, 2**32 - 1)
    assert h.start([a, b], 0) == 1
    assert h.st.running(2**32 - 1) == {0: 1}
