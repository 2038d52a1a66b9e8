"""Collectives of the sans-IO master: consensus on a tag's descriptor, start, completion,
aborts, stale reports, and departures in the middle of a collective ("exactly one terminal
message per collective and peer"). Harness: ``master_harness``.
"""

from __future__ import annotations

import re

import msgspec
import pytest

from pccl_aio._master.core import state as ms
from pccl_aio._wire import messages as m
from tests.unit.master_harness import (
    DEPARTURES,
    Harness,
    closes,
    departure,
    index_of,
    msgs,
    ring_ids,
    run_with_silent,
    sent_to,
)

# ---- collectives ---------------------------------------------------------------------------------


def test_collective_starts_when_every_group_member_voted_with_one_descriptor() -> None:
    h = Harness()
    a, b, c = h.run(0, 0, 0)
    desc = m.CollectiveInit(7, 1000, 10, 0)
    assert h.send(a, desc) == []
    assert h.send(c, desc) == []
    assert h.st.running(0) == {}
    acts = h.send(b, desc)
    assert acts == [ms.Send(x, m.CollectiveStart(7, 1, h.st.epoch)) for x in (a, b, c)]
    assert h.st.running(0) == {7: 1}
    assert h.send(a, m.CollectiveDone(7, 1, True)) == []
    assert h.send(b, m.CollectiveDone(7, 1, True)) == []
    acts = h.send(c, m.CollectiveDone(7, 1, True))
    # the verdict carries a ticket: the seq the next run of tag 7 may start as at once
    assert acts == [ms.Send(x, m.CollectiveComplete(7, 1, 2, h.st.epoch)) for x in (a, b, c)]
    assert h.st.running(0) == {}
    # the tag is free again and a re-run gets a new seq (the ticket's)
    assert h.start([a, b, c], 7) == 2


def test_collective_seq_increases_globally_across_tags_and_groups() -> None:
    h = Harness()
    a, b, c, d = h.run(0, 0, 1, 1)
    seqs = [h.start([a, b], 1), h.start([c, d], 1), h.start([a, b], 2), h.start([d, c], 9)]
    assert seqs == [1, 2, 3, 4]
    assert h.st.running(0) == {1: 1, 2: 3}
    assert h.st.running(1) == {1: 2, 9: 4}


def test_concurrent_tags_have_independent_consensus() -> None:
    h = Harness()
    a, b = h.run(0, 0)
    assert h.send(a, m.CollectiveInit(1, 4, 5, 0)) == []
    assert h.send(a, m.CollectiveInit(2, 8, 5, 3)) == []
    acts = h.send(b, m.CollectiveInit(2, 8, 5, 3))
    assert {x.tag for v in msgs(acts, m.CollectiveStart).values() for x in v} == {2}
    acts = h.send(b, m.CollectiveInit(1, 4, 5, 0))
    assert {x.tag for v in msgs(acts, m.CollectiveStart).values() for x in v} == {1}
    assert sorted(h.st.running(0)) == [1, 2]


@pytest.mark.parametrize("field", ["count", "dtype", "op", "quant_algo", "quant_dtype"])
def test_descriptor_mismatch_rejects_for_every_voter_and_frees_the_tag(field: str) -> None:
    """Two against two: nobody is known to be wrong, every voter is refused."""
    h = Harness()
    a, b, c, d = h.run(0, 0, 0, 0)
    good = m.CollectiveInit(3, 100, 10, 0, 0, 0)
    bad = msgspec.structs.replace(good, **{field: getattr(good, field) + 1})
    assert h.send(a, good) == []
    assert h.send(b, bad) == []
    assert h.send(c, bad) == []
    acts = h.send(d, good)
    rej = msgs(acts, m.CollectiveRejected)
    assert sorted(rej) == [a, b, c, d]
    for (r,) in rej.values():
        assert r.tag == 3 and "disagree" in r.reason
    assert msgs(acts, m.CollectiveStart) == {}
    assert closes(acts) == []
    assert h.st.running(0) == {}
    assert h.start([a, b, c, d], 3) >= 1  # tag freed, nobody kicked


@pytest.mark.parametrize("field", ["count", "dtype", "op", "quant_algo"])
def test_a_lone_dissenter_is_kicked_and_the_others_start_without_it(field: str) -> None:
    """Issue 31: a member whose descriptor disagrees with every other member's (which agree)
    made every collective of the group fail, forever; it is kicked, with the reason, and the
    others' collective starts on the ring without it."""
    h = Harness()
    a, b, c = h.run(0, 0, 0)
    good = m.CollectiveInit(3, 100, 10, 0, 0, 0)
    bad = msgspec.structs.replace(good, **{field: getattr(good, field) + 1})
    assert h.send(a, good) == []
    assert h.send(b, bad) == []
    acts = h.send(c, good)
    kicked = sent_to(acts, b, m.Kicked)
    assert len(kicked) == 1 and "disagrees with every other member's" in kicked[0].reason
    assert closes(acts) == [b] and msgs(acts, m.CollectiveRejected) == {}
    assert sorted(msgs(acts, m.CollectiveStart)) == [a, c]
    assert h.st.accepted() == [a, c]


@pytest.mark.parametrize(("descs", "words"), [
    ([(1024, 10, 0, 0, 0), (1024, 10, 1, 0, 0)],
     "peer 1: 1024 x float32 SUM, peer 2: 1024 x float32 AVG"),
    ([(8, 9, 3, 0, 0), (8, 7, 3, 0, 0)], "peer 1: 8 x bfloat16 MAX, peer 2: 8 x int64 MAX"),
    ([(4, 10, 0, 1, 0), (4, 10, 0, 2, 2)],
     "peer 1: 4 x float32 SUM quantized MIN_MAX to uint8, "
     "peer 2: 4 x float32 SUM quantized ZERO_POINT_SCALE to uint16"),
    ([(5, 10, 0, 1, 12), (5, 10, 0, 1, 0)],
     "peer 1: 5 x float32 SUM quantized MIN_MAX to uint4, "
     "peer 2: 5 x float32 SUM quantized MIN_MAX to uint8"),
    ([(4, 99, 0, 0, 0), (4, 10, 77, 0, 0)],  # built past decoding: codes, never a crash
     "peer 1: 4 x DataType 99 SUM, peer 2: 4 x float32 ReduceOp 77"),
])
def test_descriptor_mismatch_names_dtypes_and_ops(descs: list[tuple[int, ...]],
                                                  words: str) -> None:
    h = Harness()
    a, b = h.run(0, 0)
    assert h.send(a, m.CollectiveInit(3, *descs[0])) == []
    rej = msgs(h.send(b, m.CollectiveInit(3, *descs[1])), m.CollectiveRejected)
    words = re.sub(r"peer (\d): ", r"peer \1: all-reduce ", words)
    assert rej[a][0].reason == ("peers disagree on kind/count/dtype/op/root/quantization: "
                                + words)
    assert not rej[a][0].deadlock


def test_failed_done_aborts_for_every_participant_exactly_once() -> None:
    h = Harness()
    a, b, c = h.run(0, 0, 0)
    seq = h.start([a, b, c], 4)
    assert h.send(a, m.CollectiveDone(4, seq, True)) == []
    acts = h.send(b, m.CollectiveDone(4, seq, False, "socket closed"))
    ab = msgs(acts, m.CollectiveAbort)
    assert sorted(ab) == [a, b, c]  # the reporter and the peer that already succeeded too
    for (x,) in ab.values():
        assert (x.tag, x.seq) == (4, seq) and "socket closed" in x.reason
    assert len(acts) == 3
    # late reports of the same attempt are stale: no second terminal message
    assert h.send(c, m.CollectiveDone(4, seq, False, "me too")) == []
    assert h.send(c, m.CollectiveDone(4, seq, True)) == []
    assert h.st.running(0) == {}
    assert h.start([a, b, c], 4) > seq


def test_stale_and_foreign_done_reports_are_ignored() -> None:
    h = Harness()
    a, b, x, y = h.run(0, 0, 1, 1)
    assert h.send(a, m.CollectiveDone(5, 0, False)) == []  # unknown tag
    h.init([a], 5)
    assert h.send(a, m.CollectiveDone(5, 0, True)) == []  # voting: seq 0 is no attempt
    assert h.send(b, m.CollectiveDone(5, 0, False)) == []  # b did not vote: nothing to withdraw
    h.start([x, y], 9)  # move the global seq on
    acts = h.init([b], 5)
    seq = msgs(acts, m.CollectiveStart)[a][0].seq
    for bad in (seq + 1, seq - 1, 0, -1):
        assert h.send(a, m.CollectiveDone(5, bad, False)) == []
    # a peer of another group reporting group 0's tag and seq does not touch group 0's op
    assert h.send(x, m.CollectiveDone(5, seq, False)) == []
    assert h.send(y, m.CollectiveDone(5, seq, True)) == []
    assert h.st.running(0) == {5: seq}
    h.send(a, m.CollectiveDone(5, seq, True))
    acts = h.send(b, m.CollectiveDone(5, seq, True))
    assert sorted(msgs(acts, m.CollectiveComplete)) == [a, b]


def test_failed_done_with_seq_zero_withdraws_a_voting_collective_for_every_voter() -> None:
    h = Harness()
    a, b, c = h.run(0, 0, 0)
    h.init([a, b], 1)
    h.send(a, m.CollectiveInit(2, 8, 10, 0))
    acts = h.send(b, m.CollectiveDone(1, 0, False, "cancelled"))
    assert [x.conn for x in acts] == [a, b]
    for x in acts:
        assert isinstance(x.msg, m.CollectiveAbort) and (x.msg.tag, x.msg.seq) == (1, 0)
        assert "cancelled" in x.msg.reason
    # withdrawn once: a second report is stale; the other tag still votes
    assert h.send(a, m.CollectiveDone(1, 0, False, "cancelled")) == []
    assert sorted(msgs(h.init([b, c], 2), m.CollectiveStart)) == [a, b, c]
    # tag 1 is free for everyone again
    assert sorted(msgs(h.init([a, b, c], 1), m.CollectiveStart)) == [a, b, c]


def test_duplicate_ok_done_counts_once() -> None:
    h = Harness()
    a, b = h.run(0, 0)
    seq = h.start([a, b], 1)
    assert h.send(a, m.CollectiveDone(1, seq, True)) == []
    assert h.send(a, m.CollectiveDone(1, seq, True)) == []
    assert h.st.running(0) == {1: seq}
    assert sorted(msgs(h.send(b, m.CollectiveDone(1, seq, True)), m.CollectiveComplete)) == [a, b]


def test_single_peer_collective_is_aborted_with_seq_zero_and_tag_freed() -> None:
    h = Harness()
    (a,) = h.run(0)
    for _ in range(2):
        acts = h.send(a, m.CollectiveInit(1, 4, 10, 0))
        assert len(acts) == 1
        (ab,) = sent_to(acts, a)
        assert isinstance(ab, m.CollectiveAbort) and (ab.tag, ab.seq) == (1, 0)
    assert h.st.running(0) == {}


def test_groups_of_one_cannot_run_collectives() -> None:
    """Scenario 11: A in group 0, B in group 1: ws 2, 2 groups, largest 1, TOO_FEW_PEERS."""
    h = Harness()
    (a,) = h.run(0)
    b, _ = h.join(1)
    acts = h.send(a, m.VoteUpdateTopology())  # admits b: the membership goes to both
    for conn in (a, b):
        (mm,) = sent_to(acts, conn, m.Membership)
        assert (mm.global_world_size, mm.num_groups, mm.largest_group_world_size) == (2, 2, 1)
        assert ring_ids(mm) == [conn]
        acts2 = h.send(conn, m.CollectiveInit(0, 4, 10, 0))
        assert acts2 == [ms.Send(conn, m.CollectiveAbort(0, 0, acts2[0].msg.reason))]


@pytest.mark.parametrize("how", DEPARTURES)
def test_departure_mid_collective_updates_membership_then_aborts_survivors(how: str) -> None:
    h = Harness()
    a, b, c = run_with_silent(h, (0, 0, 0), 1)
    h.now = -10.0
    h.send(b, m.CollectiveInit(5, 8, 10, 0))
    h.now = 0.0
    acts = h.init([a, c], 5)
    seq = msgs(acts, m.CollectiveStart)[a][0].seq
    epoch = h.st.epoch
    acts = departure(h, how, b)
    assert sorted(msgs(acts, m.Membership)) == [a, c]
    for conn in (a, c):
        (mm,) = sent_to(acts, conn, m.Membership)
        assert mm.epoch == epoch + 1 and ring_ids(mm) == [a, c] and mm.global_world_size == 2
        (ab,) = sent_to(acts, conn, m.CollectiveAbort)
        assert (ab.tag, ab.seq) == (5, seq)
    # membership goes out before any abort, so survivors see the smaller ring first
    last_membership = max(i for i, x in enumerate(acts) if isinstance(x.msg, m.Membership))
    first_abort = min(i for i, x in enumerate(acts) if isinstance(x.msg, m.CollectiveAbort))
    assert last_membership < first_abort
    assert h.st.accepted() == [a, c] and h.st.running(0) == {}
    # the survivors retry the same tag: it starts on the smaller ring, with a new seq
    acts = h.init([a, c], 5)
    assert msgs(acts, m.CollectiveStart) == {
        a: [m.CollectiveStart(5, seq + 1, epoch + 1)],
        c: [m.CollectiveStart(5, seq + 1, epoch + 1)]}
    h.send(a, m.CollectiveDone(5, seq + 1, True))
    done = h.send(c, m.CollectiveDone(5, seq + 1, True))
    assert sorted(msgs(done, m.CollectiveComplete)) == [a, c]


def test_departure_after_own_success_report_still_aborts_the_others() -> None:
    h = Harness()
    a, b, c = h.run(0, 0, 0)
    seq = h.start([a, b, c], 2)
    h.send(a, m.CollectiveDone(2, seq, True))
    h.send(b, m.CollectiveDone(2, seq, True))
    acts = h.disconnect(a)
    assert sorted(msgs(acts, m.CollectiveAbort)) == [b, c]
    assert msgs(acts, m.CollectiveComplete) == {}


def test_departure_aborts_every_running_collective_of_the_group_only() -> None:
    h = Harness()
    a, b, c, x, y = h.run(0, 0, 0, 1, 1)
    s1, s2, s3 = h.start([a, b, c], 1), h.start([a, b, c], 2), h.start([x, y], 1)
    h.send(a, m.CollectiveInit(3, 1, 1, 1))  # a voting op of a survivor stays voting
    acts = h.disconnect(c)
    aborts = {(conn, x_.tag, x_.seq) for conn, v in msgs(acts, m.CollectiveAbort).items()
              for x_ in v}
    assert aborts == {(a, 1, s1), (b, 1, s1), (a, 2, s2), (b, 2, s2)}
    assert sorted(msgs(acts, m.Membership)) == [a, b, x, y]
    assert h.st.running(1) == {1: s3}
    h.send(x, m.CollectiveDone(1, s3, True))
    assert sorted(msgs(h.send(y, m.CollectiveDone(1, s3, True)), m.CollectiveComplete)) == [x, y]
    # the voting op now only waits for b
    acts = h.send(b, m.CollectiveInit(3, 1, 1, 1))
    assert sorted(msgs(acts, m.CollectiveStart)) == [a, b]


@pytest.mark.parametrize("how", DEPARTURES)
def test_departure_of_the_last_non_voter_starts_the_voting_collective(how: str) -> None:
    h = Harness()
    a, b, c = run_with_silent(h, (0, 0, 0), 2)
    h.init([a, b], 1)
    acts = departure(h, how, c)
    starts = msgs(acts, m.CollectiveStart)
    assert sorted(starts) == [a, b]
    assert starts[a][0].epoch == h.st.epoch
    assert index_of(acts, a, m.Membership) < index_of(acts, a, m.CollectiveStart)


def test_departure_of_a_voter_recomputes_consensus_without_its_descriptor() -> None:
    h = Harness()
    a, b, c = h.run(0, 0, 0)
    h.send(a, m.CollectiveInit(1, 999, 10, 0))  # a's odd descriptor is forgotten with a
    h.send(b, m.CollectiveInit(1, 8, 10, 0))
    acts = h.disconnect(a)
    assert msgs(acts, m.CollectiveRejected) == {} and msgs(acts, m.CollectiveStart) == {}
    acts = h.send(c, m.CollectiveInit(1, 8, 10, 0))
    assert sorted(msgs(acts, m.CollectiveStart)) == [b, c]


def test_departure_of_the_only_voter_drops_the_voting_collective() -> None:
    h = Harness()
    a, b, c = h.run(0, 0, 0)
    h.send(a, m.CollectiveInit(1, 999, 10, 0))
    acts = h.disconnect(a)
    assert [type(x.msg) for x in acts] == [m.Membership, m.Membership]
    acts = h.init([b, c], 1)
    assert sorted(msgs(acts, m.CollectiveStart)) == [b, c]


def test_departure_reveals_a_descriptor_mismatch() -> None:
    h = Harness()
    a, b, c = h.run(0, 0, 0)
    h.send(a, m.CollectiveInit(1, 8, 10, 0))
    h.send(b, m.CollectiveInit(1, 8, 11, 0))
    acts = h.disconnect(c)
    assert sorted(msgs(acts, m.CollectiveRejected)) == [a, b]


def test_consensus_with_fewer_than_two_voters_aborts_with_seq_zero() -> None:
    h = Harness()
    a, b = h.run(0, 0)
    h.send(a, m.CollectiveInit(6, 8, 10, 0))
    acts = h.disconnect(b)
    assert [type(x.msg) for x in acts] == [m.Membership, m.CollectiveAbort]
    ab = acts[1].msg
    assert acts[1].conn == a and (ab.tag, ab.seq) == (6, 0)
    assert h.st.running(0) == {}
    # the tag is free: the next init is answered (again with seq 0), not kicked
    acts = h.send(a, m.CollectiveInit(6, 8, 10, 0))
    assert [(x.conn, type(x.msg)) for x in acts] == [(a, m.CollectiveAbort)]


@pytest.mark.parametrize("first_plain", [False, True])
def test_a_stalled_predecessor_is_kicked_even_when_another_report_came_first(
        first_plain: bool) -> None:
    """Issue 31: a member named by its successor as having sent nothing of the attempt
    within the data timeout (``stalled``) is kicked, also when a plain failure report of
    another participant aborted the attempt first (the stall report is then stale)."""
    h = Harness()
    a, b, c = h.run(0, 0, 0)
    seq = h.start([a, b, c], 5)
    out: list[ms.Action] = []
    if first_plain:  # b's timer fired first (it had some data from a): a plain abort
        out += h.send(b, m.CollectiveDone(5, seq, False, "stalled"))
        assert sorted(msgs(out, m.CollectiveAbort)) == [a, b, c] and closes(out) == []
        out += h.init([a, b], 5)  # the survivors' retry votes come before a's report
    out += h.send(a, m.CollectiveDone(5, seq, False, "stalled", c, True))
    kicked = sent_to(out, c, m.Kicked)
    assert len(kicked) == 1 and "sent no data of collective tag 5" in kicked[0].reason
    assert c in closes(out) and h.st.accepted() == [a, b]
    # a stall report naming a non-participant or itself kicks nobody
    out = h.send(a, m.CollectiveDone(5, seq, False, "stalled", a, True))
    assert closes(out) == []


# ---- issue 32: the start rules of the ranked kinds -------------------------------------------
def _ranked(tag: int, epoch: int, kind: int = 3, root: int = 0) -> m.CollectiveInit:
    return m.CollectiveInit(tag, 8, 10, 0, kind=kind, root=root, epoch=epoch)


@pytest.mark.parametrize("kind", [1, 2, 3, 4])
def test_a_ranked_kind_starts_when_every_member_voted_in_the_current_ring(kind: int) -> None:
    h = Harness()
    a, b, c = h.run(0, 0, 0)
    init = _ranked(5, h.st.epoch, kind)
    if kind == 1:
        init = m.CollectiveInit(5, 0, 0, 0, kind=1, epoch=h.st.epoch)
    assert h.send(a, init) == [] and h.send(b, init) == []
    starts = msgs(h.send(c, init), m.CollectiveStart)
    assert sorted(starts) == [a, b, c]


@pytest.mark.parametrize("kind", [1, 2, 3, 4])
def test_a_ranked_kind_launched_before_its_ring_changed_is_aborted_for_every_voter(kind: int
                                                                                   ) -> None:
    h = Harness()
    a, b, c = h.run(0, 0, 0)
    before = h.st.epoch
    count = 0 if kind == 1 else 8
    init = m.CollectiveInit(5, count, 0 if kind == 1 else 10, 0, kind=kind, epoch=before)
    assert h.send(a, init) == [] and h.send(b, init) == []
    acts = h.disconnect(c)  # the ring changes: a and b voted in the old one
    aborts = msgs(acts, m.CollectiveAbort)
    assert sorted(aborts) == [a, b] and msgs(acts, m.CollectiveStart) == {}
    assert all("ring changed" in x.reason and x.seq == 0 for (x,) in aborts.values())
    # the retry, in the new ring, starts; an all-reduce would have started at once
    again = m.CollectiveInit(5, count, 0 if kind == 1 else 10, 0, kind=kind, epoch=h.st.epoch)
    h.send(a, again)
    assert sorted(msgs(h.send(b, again), m.CollectiveStart)) == [a, b]


def test_an_all_reduce_whose_ring_changed_before_its_start_runs_in_the_new_one() -> None:
    h = Harness()
    a, b, c = h.run(0, 0, 0)
    h.send(a, m.CollectiveInit(5, 8, 10, 0))
    h.send(b, m.CollectiveInit(5, 8, 10, 0))
    assert sorted(msgs(h.disconnect(c), m.CollectiveStart)) == [a, b]


def test_another_groups_change_does_not_void_a_ranked_kind() -> None:
    h = Harness()
    a, b, _x, y = h.run(0, 0, 1, 1)
    init = _ranked(5, h.st.epoch)
    h.send(a, init)
    h.disconnect(y)  # group 1 changes; group 0's ring is as it was
    assert h.st.epoch > init.epoch
    assert sorted(msgs(h.send(b, init), m.CollectiveStart)) == [a, b]


def test_a_broadcast_root_outside_the_group_is_rejected_for_every_voter() -> None:
    h = Harness()
    a, b = h.run(0, 0)
    init = _ranked(5, h.st.epoch, kind=2, root=2)
    h.send(a, init)
    rej = msgs(h.send(b, init), m.CollectiveRejected)
    assert sorted(rej) == [a, b]
    assert all("root rank 2 is not in a group of 2" in r.reason for (r,) in rej.values())
