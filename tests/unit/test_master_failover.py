"""The sans-IO master's side of failover (issue 20): a fresh master rebuilds a run from
rejoining peers (ids, groups, ring order, floors, revisions, verdicts of operations in
doubt), fresh peers wait as joiners meanwhile, a master steps down for a higher term, and
peers of another run are refused."""

from __future__ import annotations

from pccl_aio._master.core import state as ms
from pccl_aio._wire import messages as m
from pccl_aio._wire.recovery import REBUILT_WITHOUT
from tests.unit.master_harness import PV, Harness, closes, msgs, sent_to, sync_vote

RING = [7, 4, 9]  # the old master's ring order (peer ids)


def rejoin_hello(peer: int, *, ring: list[int] = RING, term: int = 1, epoch: int = 12,
                 accepted: bool = True, max_seq: int = 100, revision: int = 5,
                 doubts: list[m.Doubt] | None = None, run: str = "run-a",
                 group: int = 0, rounds: list[m.Round] | None = None) -> m.Hello:
    return m.Hello(PV, group, 40000 + peer, "", 0, False, run, term,
                   m.Rejoin(peer, accepted, term, epoch, ring, max_seq, revision, doubts or [],
                            rounds or []))


def rejoin(h: Harness, peer: int, **kw: object) -> list[ms.Action]:
    conn = h.st.allocate(peer)
    assert conn == peer  # a rejoining peer keeps its id
    assert h.handle(ms.Connected(conn, "127.0.0.1", h.now)) == []
    return h.send(conn, rejoin_hello(peer, **kw))  # type: ignore[arg-type]


def fresh() -> Harness:
    h = Harness()
    h.st = ms.MasterState(heartbeat_timeout=5.0, recovery_grace=5.0)  # no run id: the rejoiners'
    return h


def test_a_fresh_master_rebuilds_the_run_when_every_member_is_back():
    h = fresh()
    a = rejoin(h, 4)
    assert sent_to(a, 4) == [m.Welcome(4, False, PV, 2, "run-a", True)]  # term 1 + 1, their run
    assert rejoin(h, 9) == [ms.Send(9, m.Welcome(9, False, PV, 2, "run-a", True))]
    assert h.st.accepted() == []  # 7 is still missing
    acts = rejoin(h, 7)
    members = msgs(acts, m.Membership)
    assert sorted(members) == sorted(RING)
    ms_ = members[7][0]
    assert [p.peer_id for p in ms_.ring] == RING  # the ring order it had
    assert ms_.epoch == 13 and ms_.term == 2
    assert h.st.ring(0) == RING and h.st.term == 2 and h.st.run_id == "run-a"
    # collective numbering resumes above every seq the peers saw
    seq = h.start(RING, 3)
    assert seq > 100
    # a fresh peer gets an id above every id the rejoiners named
    assert h.st.allocate() == 10


def test_the_rebuild_goes_on_without_missing_members_after_the_grace():
    h = fresh()
    rejoin(h, 4)
    rejoin(h, 9)
    assert h.tick(4.9) and h.st.accepted() == []
    acts = h.tick(5.0)
    assert sorted(msgs(acts, m.Membership)) == [4, 9]
    assert h.st.ring(0) == [4, 9]


def test_a_new_peer_during_the_rebuild_is_a_joiner():
    h = fresh()
    rejoin(h, 4)
    j, acts = h.join()
    assert sent_to(acts, j) == [m.Welcome(j, False, PV, 2, "run-a")]
    assert j not in RING
    rejoin(h, 7)
    rejoin(h, 9)
    assert h.st.accepted() == sorted(RING) and h.st.pending() == [j]
    acts = h.vote_topology_all()
    assert h.st.accepted() == sorted([*RING, j])


def test_a_joiner_that_waited_at_an_unfinished_rebuild_does_not_demote_the_members():
    """Master 1 (term 1) dies, master 2 starts rebuilding (term 2) and a fresh peer waits for
    admission there; master 2 dies before its rebuild finished. At master 3 the members' last
    Membership is of term 1, the joiner's master was of term 2: the members stay members and
    the joiner waits (it counted, and the members were made joiners and admitted with it as
    a fresh run, their collectives in doubt aborted: a DeadlockError in the churn test)."""
    h = fresh()
    rejoin(h, 6, accepted=False, ring=[], term=2, epoch=0, revision=-1)
    rejoin(h, 4)
    assert h.st.accepted() == []
    acts = h.tick(5.0)  # (7 and 9 never came back)
    assert sorted(msgs(acts, m.Membership)) == [4]
    assert h.st.accepted() == [4] and h.st.pending() == [6] and h.st.ring(0) == [4]


def test_a_waiting_peer_rejoins_waiting_and_a_stale_ring_makes_a_joiner():
    h = fresh()
    rejoin(h, 4)
    rejoin(h, 7)
    rejoin(h, 3, ring=[], accepted=False)  # it was waiting to join
    rejoin(h, 5, ring=[5, 7], epoch=2)  # an old ring: it was dropped since
    acts = rejoin(h, 9)
    assert h.st.accepted() == sorted(RING)
    # 5 claimed to be a member: it is told it is none (it joins again, as a new member) and
    # its session ends; 3 knew it was waiting and waits on
    (told,) = sent_to(acts, 5)
    assert told == m.Superseded(2, REBUILT_WITHOUT)
    assert closes(acts) == [5] and sent_to(acts, 3) == []
    assert h.st.pending() == [3]
    assert sorted(msgs(acts, m.Membership)) == sorted(RING)  # the members are undisturbed


def test_a_waiting_peers_rejoin_alone_does_not_rebuild_the_run():
    """A restarted master that first hears a peer that was waiting to join (it knows no
    ring) waits for the members: the run is theirs, not a new one from revision 0 (churn
    with master restarts found this: the joiner became the run and the members its joiners)."""
    h = fresh()
    rejoin(h, 3, ring=[], accepted=False)
    assert h.st.accepted() == []
    assert msgs(h.tick(1.0), m.Membership) == {} and h.st.accepted() == []
    rejoin(h, 4)
    rejoin(h, 7)
    acts = rejoin(h, 9)
    assert sorted(msgs(acts, m.Membership)) == sorted(RING)
    assert h.st.accepted() == sorted(RING) and h.st.pending() == [3]


def test_a_waiting_peer_alone_is_admitted_after_the_grace():
    h = fresh()
    rejoin(h, 3, ring=[], accepted=False)
    assert msgs(h.tick(4.9), m.Membership) == {} and h.st.accepted() == []
    assert list(msgs(h.tick(5.0), m.Membership)) == [3] and h.st.accepted() == [3]


def test_doubts_complete_only_when_every_reporting_member_finished():
    h = fresh()
    rejoin(h, 4, doubts=[m.Doubt(0, 1, 90, True), m.Doubt(0, 2, 91, True)])
    rejoin(h, 9, doubts=[m.Doubt(0, 2, 91, False)])  # it gave tag 2 up: aborted for all
    acts = rejoin(h, 7)  # completed tag 1 before the master died: it reports nothing
    assert sent_to(acts, 4, m.CollectiveComplete) == [m.CollectiveComplete(1, 90)]
    assert sent_to(acts, 4, m.CollectiveAbort)[0].tag == 2  # type: ignore[attr-defined]
    assert sent_to(acts, 9, m.CollectiveAbort) == []  # it failed it already
    first = [type(x) for x in sent_to(acts, 4)]
    assert first[0] is m.Membership  # verdicts come after the new membership


def test_a_sync_in_doubt_completes_only_if_every_member_in_it_finished():
    h = fresh()
    rejoin(h, 4, doubts=[m.Doubt(1, 0, 6, True)])
    rejoin(h, 9, doubts=[m.Doubt(1, 0, 6, True)])
    acts = rejoin(h, 7)
    assert sent_to(acts, 4, m.SyncComplete) == [m.SyncComplete(6)]
    # the revision the sync reached is the group's: the next sync adds one to it
    out: list[ms.Action] = []
    for c in RING:
        out += h.send(c, sync_vote(revision=7))
    assert {p.revision for (p,) in msgs(out, m.SyncPlan).values()} == {7}  # type: ignore[attr-defined]
    h2 = fresh()
    rejoin(h2, 4, doubts=[m.Doubt(1, 0, 6, True)])
    rejoin(h2, 9, doubts=[m.Doubt(1, 0, 0, False)])  # voted, had no plan yet
    acts = rejoin(h2, 7)
    assert sent_to(acts, 4, m.SyncFailed)  # not every member finished: it fails for all
    assert sent_to(acts, 4, m.SyncComplete) == []


def test_the_rebuilt_revision_holds_the_one_increment_rule():
    h = fresh()
    for p in RING:
        rejoin(h, p, revision=5)
    out: list[ms.Action] = []
    for c in RING:
        out += h.send(c, sync_vote(revision=7 if c == 4 else 6))
    assert sent_to(out, 4, m.Kicked)  # 7 skips ahead of 5 + 1
    plans = msgs(out, m.SyncPlan)
    assert {p.revision for (p,) in plans.values()} == {6}  # type: ignore[attr-defined]


def test_a_rejoin_into_a_live_run_is_a_joiner_and_its_doubts_fail():
    h = Harness()
    a, b = h.run(0, 0)
    h.now = 5.0  # the run is no longer provisional (its grace passed)
    h.send(a, m.Heartbeat())
    h.send(b, m.Heartbeat())
    conn = h.st.allocate(8)
    h.handle(ms.Connected(conn, "127.0.0.1", h.now))
    acts = h.send(conn, rejoin_hello(8, ring=[8, 2], run="test-run", doubts=[
        m.Doubt(0, 5, 3, True), m.Doubt(1, 0, 4, True)]))
    # The Welcome first: a peer's session starts with it. With the aborts first (issue 31:
    # a peer frozen past the heartbeat timeout, its sync in doubt) it redialled forever.
    assert isinstance(sent_to(acts, 8)[0], m.Welcome)
    assert sent_to(acts, 8, m.CollectiveAbort)[0].tag == 5  # type: ignore[attr-defined]
    assert sent_to(acts, 8, m.SyncFailed)
    assert h.st.pending() == [8] and h.st.accepted() == [a, b]


def test_a_peers_higher_term_does_not_make_a_master_with_members_step_down():
    """One member's ``Hello`` naming a higher term used to end every member's session and
    make the sender the run; a peer's word is no evidence: the master keeps its members and
    its term (one up to 2**63 - 1 left no term for the next rebuild) and refuses the sender."""
    h = Harness()
    a, b = h.run(0, 0)
    assert h.st.term == 1
    h.now = 5.0  # the run is no longer provisional (its grace passed)
    h.send(a, m.Heartbeat())
    h.send(b, m.Heartbeat())
    conn = h.st.allocate(12)
    h.handle(ms.Connected(conn, "127.0.0.1", h.now))
    acts = h.send(conn, rejoin_hello(12, ring=[12, 13], term=3, run="test-run"))
    for c in (a, b):
        assert not sent_to(acts, c, m.Superseded) and ms.Close(c, "superseded") not in acts
    assert h.st.accepted() == [a, b] and h.st.pending() == [] and h.st.term == 1
    assert isinstance(sent_to(acts, conn)[0], m.Rejected)
    assert "above this master's 1" in sent_to(acts, conn)[0].reason  # type: ignore[attr-defined]
    conn = h.st.allocate(0)  # a new peer's Hello with a huge term: the same
    h.handle(ms.Connected(conn, "127.0.0.1", h.now))
    h.send(conn, m.Hello(PV, 0, 40000 + conn, "", 0, False, "test-run", 2**63 - 1))
    assert h.st.accepted() == [a, b] and h.st.term == 1


def test_a_claimed_id_at_the_top_never_makes_an_unencodable_id():
    """A ``Rejoin`` naming ring [2**63 - 1] (the largest id a frame may carry) used to push
    every later id past 64 bits; ids stay below 2**63."""
    h = fresh()
    rejoin(h, 4, ring=[4, 2**63 - 1])
    ids = []
    for _ in range(3):
        ids.append(h.st.allocate())
        h.handle(ms.Connected(ids[-1], "127.0.0.1", h.now))
    assert all(0 < i < 2**63 for i in ids) and len(set(ids)) == 3, ids
    for i in ids:
        m.encode(m.Welcome(i, False, PV, 2, "run-a"))


def test_peers_of_another_run_are_refused():
    h = Harness()  # run "test-run"
    h.run(0)
    conn = h.st.allocate(5)
    h.handle(ms.Connected(conn, "127.0.0.1", h.now))
    acts = h.send(conn, rejoin_hello(5, run="other-run"))
    assert isinstance(sent_to(acts, 5)[0], m.Rejected)
    assert ms.Close(5, sent_to(acts, 5)[0].reason) in acts  # type: ignore[attr-defined]


def test_probe_answers_term_run_and_members():
    h = fresh()
    assert h.st.probe() == m.ProbeAnswer(0, "", 0)
    rejoin(h, 4)
    assert h.st.probe() == m.ProbeAnswer(2, "run-a", 1)
    rejoin(h, 7)
    rejoin(h, 9)
    assert h.st.probe() == m.ProbeAnswer(2, "run-a", 3)


def test_ids_of_rejoining_peers_are_kept_when_free():
    h = fresh()
    assert h.st.allocate(5) == 5
    h.handle(ms.Connected(5, "127.0.0.1", h.now))
    assert h.st.allocate(5) == 6  # in use: a fresh id
    assert h.st.allocate(0) == 7
    assert h.st.allocate(2**64 - 1) == 8  # out of range: a fresh id


def test_a_member_that_missed_the_last_rounds_answer_gets_it_at_once():
    """The old master answered a joint vote to some members and died before the others'
    answers left: those retry the vote and get the same answer, uncounted, so every member
    goes on to the same next call."""
    h = fresh()
    h.rounds = True
    got = [m.Round("pending", 5, True), m.Round("topology", 3, True)]
    rejoin(h, 4, rounds=got)
    rejoin(h, 9, rounds=got)
    rejoin(h, 7, rounds=[m.Round("pending", 4, False), m.Round("topology", 3, True)])
    assert h.send(7, m.VotePeersPending()) == [ms.Send(7, m.PeersPendingAnswer(True, 5))]
    out: list[ms.Action] = []
    for c in RING:  # the next round counts every member again
        out += h.send(c, m.VotePeersPending())
    assert {a.msg.round for a in out} == {6}  # type: ignore[union-attr]
    assert h.send(4, m.VoteUpdateTopology()) == []  # nobody owed a topology answer: counted


def test_a_master_that_hears_of_a_higher_term_elsewhere_steps_down():
    h = Harness()
    a, b = h.run(0, 0)
    assert h.handle(ms.Heard(m.ProbeAnswer(1, "test-run", 3), "10.0.0.2:48148", h.now)) == []
    assert h.handle(ms.Heard(m.ProbeAnswer(5, "other-run", 3), "10.0.0.3:1", h.now)) == []
    assert h.handle(ms.Heard(m.ProbeAnswer(5, "test-run", 0), "10.0.0.2:48148", h.now)) == []
    assert h.st.term == 1  # the same term, another run, or nobody there: nothing changes
    acts = h.handle(ms.Heard(m.ProbeAnswer(2, "test-run", 3), "10.0.0.2:48148", h.now))
    for c in (a, b):
        (msg,) = [x for x in sent_to(acts, c) if isinstance(x, m.Superseded)]
        assert msg.term == 2 and msg.where == "10.0.0.2:48148"  # type: ignore[attr-defined]
    assert h.st.accepted() == [] and h.st.term == 2
    assert h.st.probe() == m.ProbeAnswer(2, "test-run", 0)


def test_a_master_without_members_only_takes_a_higher_term_it_hears_of():
    h = fresh()
    assert h.handle(ms.Heard(m.ProbeAnswer(3, "run-a", 2), "h:1", h.now)) == []
    assert h.st.term == 3
    rejoin(h, 4, term=3)
    assert h.st.term == 4


def test_a_run_a_new_peer_just_started_gives_way_to_the_rejoining_run():
    """A restarted master can hear a new peer before the old members: that peer starts a
    run, which the rejoining run takes over within the grace; the new peer rejoins it as a
    joiner (churn with master restarts found this)."""
    h = fresh()
    j, acts = h.join()
    assert h.st.accepted() == [j] and h.st.term == 1
    h.now = 1.0
    acts = rejoin(h, 4)
    assert isinstance(sent_to(acts, j)[0], m.Superseded) and ms.Close(j, "superseded") in acts
    assert h.st.run_id == "run-a" and h.st.accepted() == []
    rejoin(h, 7)
    acts = rejoin(h, 9)
    assert h.st.accepted() == sorted(RING) and h.st.term == 2
    # the superseded peer comes back as a joiner of the rebuilt run
    conn = h.st.allocate(j)
    assert conn == j  # its id again (a new connection: the harness forgets the closed one)
    h.closed.discard(conn)
    h.handle(ms.Connected(conn, "127.0.0.1", h.now))
    h.send(conn, m.Hello(PV, 0, 40000 + j, "", 0, False, "", 1,
                         m.Rejoin(j, False, 1, 1, [j], 0, -1)))
    assert h.st.pending() == [conn] and h.st.accepted() == sorted(RING)


def test_a_run_older_than_the_grace_refuses_another_runs_rejoin():
    h = fresh()
    h.join()
    h.now = 5.0  # no longer provisional
    for c in h.st.accepted():
        h.send(c, m.Heartbeat())
    acts = rejoin(h, 4)
    assert isinstance(sent_to(acts, 4)[0], m.Rejected)


def test_members_that_vanish_together_are_waited_for_before_a_joiner_is_admitted():
    """A master frozen longer than the heartbeat timeout drops every member; a peer that
    was waiting to join must not become the run while they rejoin (churn found this)."""
    h = Harness()
    a, b = h.run(0, 0)
    p, _ = h.join()
    h.now = 5.1
    h.send(p, m.Heartbeat())
    h.tick(5.1)  # a and b time out
    assert h.st.accepted() == [] and h.st.pending() == [p]
    conn = h.st.allocate(a)
    h.closed.discard(conn)
    h.handle(ms.Connected(conn, "127.0.0.1", h.now))
    h.send(conn, m.Hello(PV, 0, 40000 + a, "", 0, False, "test-run", 1,
                         m.Rejoin(a, True, 1, h.st.epoch, [a, b], 7, 3)))
    conn = h.st.allocate(b)
    h.closed.discard(conn)
    h.handle(ms.Connected(conn, "127.0.0.1", h.now))
    acts = h.send(conn, m.Hello(PV, 0, 40000 + b, "", 0, False, "test-run", 1,
                                m.Rejoin(b, True, 1, h.st.epoch, [a, b], 7, 3)))
    assert sorted(msgs(acts, m.Membership)) == [a, b] and h.st.accepted() == [a, b]
    assert h.st.pending() == [p] and h.st.term == 2


def test_a_member_admitted_after_a_round_is_owed_the_next_one_it_missed():
    """A peer admitted after pending round 4 (its Membership said so: ``known`` False) voted
    in round 5 and missed the answer; the others got it: it is owed round 5's answer."""
    h = fresh()
    h.rounds = True
    rejoin(h, 4, rounds=[m.Round("pending", 5, False)])
    rejoin(h, 9, rounds=[m.Round("pending", 5, False)])
    rejoin(h, 7, rounds=[m.Round("pending", 4, False, False)])
    assert h.send(7, m.VotePeersPending()) == [ms.Send(7, m.PeersPendingAnswer(False, 5))]
    assert h.send(4, m.VotePeersPending()) == []  # the others' next round counts again


def test_a_vote_waiting_in_doubt_is_answered_with_the_rebuild():
    """A member whose pending vote was waiting when the master died (the others got round
    5's answer) gets it with the rebuild, before the Membership that ends its outage."""
    h = fresh()
    h.rounds = True
    rejoin(h, 4, rounds=[m.Round("pending", 5, True)])
    rejoin(h, 9, rounds=[m.Round("pending", 5, True)])
    acts = rejoin(h, 7, rounds=[m.Round("pending", 4, False, True, True)])
    mine = sent_to(acts, 7)  # its Welcome, then the answer, then the Membership
    assert mine[1] == m.PeersPendingAnswer(True, 5) and isinstance(mine[2], m.Membership)
    assert h.send(7, m.VotePeersPending()) == []  # its next vote counts in round 6


def test_a_topology_round_is_counted_before_its_membership():
    h = Harness()
    h.rounds = True
    a, _ = h.run(0, 0)
    assert sent_to(h.join()[1], a, m.Membership) == []  # a joiner waits
    acts = h.vote_topology_all()
    (ms_a,) = sent_to(acts, a, m.Membership)
    (done,) = sent_to(acts, a, m.TopologyUpdated)
    assert ms_a.topology_round == done.round == h.st.access.vote_rounds()["topology"]


def test_the_members_grace_counts_from_the_first_member_back():
    """A peer that was waiting to join (or one whose membership claim had no valid seal)
    reaches a restarted master first; the first member comes back just before the grace
    counted from that peer ends. The rebuild still waits a whole grace for the others (it
    finished with the first member alone and made the others joiners:
    ``tests/process/test_insider.py`` met it under load), and ends at that grace."""
    h = fresh()  # grace 5 s
    rejoin(h, 3, ring=[], accepted=False)
    assert msgs(h.tick(4.0), m.Membership) == {}
    h.now = 4.5
    rejoin(h, 4)
    assert msgs(h.tick(5.0), m.Membership) == {} and h.st.accepted() == []
    h.now = 6.0
    acts = rejoin(h, 9)
    assert msgs(acts, m.Membership) == {} and h.st.accepted() == []
    assert msgs(h.tick(9.4), m.Membership) == {}
    acts = h.tick(9.5)  # 7 never came back: the rebuild ends a grace after 4 came back
    assert sorted(msgs(acts, m.Membership)) == [4, 9] and h.st.accepted() == [4, 9]


def test_a_member_back_just_before_the_grace_of_a_waiting_peer_still_brings_the_others():
    h = fresh()
    rejoin(h, 3, ring=[], accepted=False)
    h.now = 4.9
    rejoin(h, 4)
    h.now = 5.2
    rejoin(h, 7)
    acts = rejoin(h, 9)
    assert sorted(msgs(acts, m.Membership)) == sorted(RING)
    assert h.st.accepted() == sorted(RING) and h.st.pending() == [3]


def test_a_refused_claim_gets_an_id_no_member_of_the_run_holds():
    """A claim to rejoin without a valid seal (``MasterKeys.screen`` cuts it to peer id 0)
    reaching a restarted master first got the lowest fresh id: a member's, who then came back
    as a joiner under another id (``tests/process/test_insider.py``, in the full suite). Such
    a claim gets an id from far above; the members' own ids and fresh ids stay as they were."""
    h = fresh()
    outsider = h.st.allocate(0, refused=True)
    assert outsider >= 2**62
    assert h.handle(ms.Connected(outsider, "127.0.0.1", h.now)) == []
    assert h.st.allocate(0, refused=True) == outsider + 1
    assert rejoin(h, 1) and h.st.allocate() == 10  # 1 keeps its id; fresh ids above the ring
