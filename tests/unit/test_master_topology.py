"""``optimize_topology()`` on the sans-IO master: measurement rounds, the matrix across churn,
unreachable pairs, hostile reports, conflicts with other calls."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from pccl_aio._errors import RemoteProtocolError
from pccl_aio._master.core import state as ms
from pccl_aio._master.core import topology
from pccl_aio._master.core.topology import MEASURE_SECONDS, ROUND_GRACE
from pccl_aio._wire import messages as m

from .master_harness import Harness, assert_kicked, index_of, msgs, ring_ids, sent_to

pytestmark = pytest.mark.timeout(30)

FAST, SLOW = 500e6, 50e6
Rates = Callable[[int, int], float]


def uniform(a: int, b: int) -> float:
    return FAST


def vote_all(h: Harness, conns: list[int]) -> list[ms.Action]:
    out: list[ms.Action] = []
    for c in conns:
        out += h.send(c, m.VoteOptimize())
    return out


def drive(h: Harness, acts: list[ms.Action], rates: Rates = uniform
          ) -> tuple[list[list[tuple[int, int]]], list[ms.Action]]:
    """Answer every MeasurePlan with ``rates`` until no plan is left; returns the rounds (as
    (src, dst) pairs) and the actions after the last report."""
    rounds = []
    while True:
        plans = msgs(acts, m.MeasurePlan)
        if not plans:
            return rounds, acts
        ids = {p.round for ps in plans.values() for p in ps}
        assert len(ids) == 1 and all(len(ps) == 1 for ps in plans.values()), plans
        pairs = [(c, ps[0].to.peer_id) for c, ps in sorted(plans.items())]
        rounds.append(pairs)
        acts = []
        for src, dst in pairs:
            acts += h.send(src, m.MeasureReport(ids.pop() if ids else plans[src][0].round,
                                                dst, rates(src, dst), 0.005))


def answer(acts: list[ms.Action], conn: int) -> m.TopologyOptimized:
    (got,) = sent_to(acts, conn, m.TopologyOptimized)
    assert isinstance(got, m.TopologyOptimized)
    return got


def slow_between(*links: tuple[int, int]) -> Rates:
    slow = {frozenset(p) for p in links}
    return lambda a, b: SLOW if frozenset((a, b)) in slow else FAST


def test_every_missing_pair_is_measured_once_in_disjoint_rounds() -> None:
    h = Harness()
    peers = h.run(0, 0, 0, 0)
    a, b, c, d = peers
    assert vote_all(h, peers[:3]) == []  # nothing starts before the last vote
    rounds, acts = drive(h, h.send(d, m.VoteOptimize()), slow_between((a, b), (c, d)))
    pairs = [p for r in rounds for p in r]
    assert sorted(pairs) == sorted((x, y) for x in peers for y in peers if x != y)
    assert len(rounds) == 3  # a complete directed graph of 4 in 3 permutations
    for r in rounds:
        assert len({s for s, _ in r}) == len(r) and len({t for _, t in r}) == len(r)
    ring = answer(acts, a).ring
    assert ring in ([a, c, b, d], [a, d, b, c])  # avoids both slow links
    for p in peers:
        got = answer(acts, p)
        assert (got.ring, got.measured, got.bottleneck_bps) == (ring, 12, FAST)
        (membership,) = sent_to(acts, p, m.Membership)
        assert ring_ids(membership) == ring  # type: ignore[arg-type]
        assert index_of(acts, p, m.Membership) < index_of(acts, p, m.TopologyOptimized)
        assert got.epoch == h.st.epoch
    assert h.st.ring(0) == ring
    assert h.st.links()[(a, b)] == (SLOW, 0.005)


def test_a_ring_that_fits_is_kept_and_a_second_call_measures_nothing() -> None:
    h = Harness()
    peers = h.run(0, 0, 0)
    _, acts = drive(h, vote_all(h, peers))
    assert answer(acts, peers[0]).ring == peers  # uniform links: join order stays
    epoch = h.st.epoch
    rounds, acts = drive(h, vote_all(h, peers))
    assert rounds == [] and answer(acts, peers[1]) == m.TopologyOptimized(
        epoch + 1, peers, 0, FAST)


def test_after_churn_only_the_new_peers_pairs_are_measured() -> None:
    h = Harness()
    a, b, c, d = h.run(0, 0, 0, 0)
    drive(h, vote_all(h, [a, b, c, d]), slow_between((a, b), (c, d)))
    ring = h.st.ring(0)
    h.disconnect(b)
    assert all(b not in p for p in h.st.links())
    e, _ = h.join(0)
    h.vote_topology_all()
    assert h.st.ring(0) == [x for x in ring if x != b] + [e]  # order kept, joiner appended
    rounds, acts = drive(h, vote_all(h, [a, c, d, e]), slow_between((a, e), (c, d)))
    measured = sorted(p for r in rounds for p in r)
    assert measured == sorted([(e, x) for x in (a, c, d)] + [(x, e) for x in (a, c, d)])
    new = answer(acts, a)
    assert new.measured == 6 and new.bottleneck_bps == FAST
    assert (a, e) not in zip(new.ring, new.ring[1:] + new.ring[:1])


def test_unreachable_pairs_are_never_neighbours() -> None:
    h = Harness()
    peers = h.run(0, 0, 0, 0)
    a, b, c, d = peers
    cut = {(a, b), (b, a), (c, d), (d, c)}
    _, acts = drive(h, vote_all(h, peers), lambda x, y: 0.0 if (x, y) in cut else FAST)
    ring = answer(acts, a).ring
    edges = set(zip(ring, ring[1:] + ring[:1]))
    assert not edges & cut


def test_no_ring_avoids_the_unreachable_peer_every_voter_gets_an_error() -> None:
    h = Harness()
    peers = h.run(0, 0, 0)
    a, _, c = peers
    epoch, ring = h.st.epoch, h.st.ring(0)
    _, acts = drive(h, vote_all(h, peers), lambda x, y: 0.0 if c in (x, y) else FAST)
    got = msgs(acts, m.VoteRejected)
    assert sorted(got) == peers and msgs(acts, m.Membership) == {}
    assert "no ring" in got[a][0].reason and f"{a}->{c}" in got[a][0].reason  # type: ignore[attr-defined]
    assert h.st.epoch == epoch and h.st.ring(0) == ring


@pytest.mark.parametrize("bad", ["unasked", "twice", "future", "zero"])
def test_hostile_reports_are_kicked(bad: str) -> None:
    h = Harness()
    peers = h.run(0, 0, 0)
    plans = msgs(vote_all(h, peers), m.MeasurePlan)
    src, (plan,) = next(iter(plans.items()))
    assert isinstance(plan, m.MeasurePlan)
    if bad == "unasked":
        other = next(c for c in peers if c not in (src, plan.to.peer_id))
        report = m.MeasureReport(plan.round, other, 1e9, 0.001)
    elif bad == "twice":
        assert h.send(src, m.MeasureReport(plan.round, plan.to.peer_id, 1e9, 0.001)) == []
        report = m.MeasureReport(plan.round, plan.to.peer_id, 1e9, 0.001)
    else:
        report = m.MeasureReport(plan.round + 1 if bad == "future" else 0, src, 1e9, 0.0)
    acts = h.send(src, report)
    assert_kicked(acts, src)
    # the others go on without it and finish
    for c, (p,) in plans.items():
        if c != src and p.to.peer_id != src:  # type: ignore[attr-defined]
            acts += h.send(c, m.MeasureReport(plan.round, p.to.peer_id, FAST, 0.001))  # type: ignore[attr-defined]
    _, end = drive(h, acts)
    assert sorted(msgs(end, m.TopologyOptimized)) == sorted(set(peers) - {src})


@pytest.mark.parametrize("field,value", [("bits_per_s", -1.0), ("bits_per_s", 1e14),
                                         ("latency", -0.5), ("latency", float("nan"))])
def test_out_of_range_reports_do_not_decode(field: str, value: float) -> None:
    fields = {"bits_per_s": 1e9, "latency": 0.001, field: value}
    body = m.encode(m.MeasureReport(1, 2, fields["bits_per_s"], fields["latency"]))
    with pytest.raises(RemoteProtocolError, match=field):
        m.decode_peer_to_master(body)


def test_a_sender_that_never_reports_is_kicked_after_the_grace_time() -> None:
    h = Harness(heartbeat_timeout=60.0)  # it still beats: only the report is missing
    peers = h.run(0, 0, 0)
    plans = msgs(vote_all(h, peers), m.MeasurePlan)
    silent = min(plans)
    acts: list[ms.Action] = []
    for c, (p,) in plans.items():
        if c != silent:
            assert isinstance(p, m.MeasurePlan)
            acts += h.send(c, m.MeasureReport(p.round, p.to.peer_id, FAST, 0.001))
    assert msgs(acts, m.MeasurePlan) == {}  # the round waits for the silent sender
    assert msgs(h.tick(MEASURE_SECONDS + ROUND_GRACE - 0.5), m.Kicked) == {}
    acts = h.tick(MEASURE_SECONDS + ROUND_GRACE + 0.5)
    assert_kicked(acts, silent)
    _, end = drive(h, acts)
    assert sorted(msgs(end, m.TopologyOptimized)) == sorted(set(peers) - {silent})


def test_a_departure_during_the_measurement_drops_its_pairs() -> None:
    h = Harness()
    peers = h.run(0, 0, 0, 0)
    acts = vote_all(h, peers)
    leaver = peers[2]
    acts = h.disconnect(leaver) + acts  # its plan may be unanswered; the rest goes on
    rounds, end = drive(h, acts)
    rest = [c for c in peers if c != leaver]
    got = answer(end, rest[0])
    assert sorted(got.ring) == rest and all(leaver not in p for r in rounds[1:] for p in r)


def test_withdrawals_in_the_vote_and_during_the_measurement() -> None:
    h = Harness()
    a, b, c = h.run(0, 0, 0)
    h.send(a, m.VoteOptimize())
    assert sent_to(h.send(a, m.WithdrawVote("optimize")), a) == [m.VoteWithdrawn("optimize")]
    assert msgs(vote_all(h, [b, c]), m.MeasurePlan) == {}  # a's vote is gone
    plans = msgs(h.send(a, m.VoteOptimize()), m.MeasurePlan)
    assert sorted(plans) == [a, b, c]
    (p,) = plans.pop(a)
    assert isinstance(p, m.MeasurePlan)
    assert h.send(a, m.MeasureReport(p.round, p.to.peer_id, FAST, 0.001)) == []
    acts = h.send(b, m.WithdrawVote("optimize"))
    rejected = msgs(acts, m.VoteRejected)
    assert sorted(rejected) == [a, c] and sent_to(acts, b) == [m.VoteWithdrawn("optimize")]
    # reports of the ended run are ignored (and not kicked); what was reported before stays
    for src, (p,) in plans.items():
        assert isinstance(p, m.MeasurePlan)
        assert h.send(src, m.MeasureReport(p.round, p.to.peer_id, FAST, 0.001)) == []
    _, end = drive(h, vote_all(h, [a, b, c]))
    assert answer(end, a).measured == 5


def test_optimize_vote_next_to_a_launch_that_needs_the_voter_fails() -> None:
    """b launched tag 1: it cannot vote optimize before tag 1 starts, which needs a, who
    waits in optimize_topology(): a gets a typed error at once; b's collective goes on."""
    h = Harness()
    a, b = h.run(0, 0)
    assert h.send(a, m.VoteOptimize()) == []
    acts = h.send(b, m.CollectiveInit(1, 8, 10, 0))
    (rej,) = sent_to(acts, a)
    assert isinstance(rej, m.VoteRejected) and rej.kind == "optimize" and rej.deadlock
    assert "optimize_topology()" in rej.reason and "all_reduce(tag=1)" in rej.reason
    assert sent_to(acts, b) == []
    assert sorted(msgs(h.send(a, m.CollectiveInit(1, 8, 10, 0)), m.CollectiveStart)) == [a, b]


def test_optimize_vote_next_to_an_awaited_collective_is_a_deadlock_for_both() -> None:
    h = Harness()
    a, b, c = h.run(0, 0, 0)
    acts = h.send(b, m.CollectiveInit(1, 8, 10, 0)) + h.send(b, m.CollectiveWait(1))
    acts += h.send(c, m.CollectiveInit(1, 8, 10, 0)) + h.send(c, m.CollectiveWait(1))
    assert acts == []
    acts = h.send(a, m.VoteOptimize())
    (rej,) = sent_to(acts, a)
    assert isinstance(rej, m.VoteRejected) and rej.deadlock
    for x in (b, c):
        (got,) = sent_to(acts, x)
        assert isinstance(got, m.CollectiveRejected) and got.deadlock


def test_optimize_vote_with_a_collective_running_is_kicked() -> None:
    h = Harness()
    a, b = h.run(0, 0)
    h.send(a, m.CollectiveInit(1, 8, 10, 0))
    assert_kicked(h.send(a, m.VoteOptimize()), a)
    c, _ = h.join(0)
    h.send(b, m.VoteUpdateTopology())
    assert h.send(b, m.VoteOptimize()) == []
    assert_kicked(h.send(b, m.VoteOptimize()), b)  # twice
    assert h.send(c, m.VoteOptimize())  # alone in the group now: answered at once


def test_groups_optimize_separately() -> None:
    h = Harness()
    a, b, x, y = h.run(0, 0, 1, 1)
    acts = vote_all(h, [x, y])
    rounds, end = drive(h, acts)
    assert {p for r in rounds for p in r} == {(x, y), (y, x)}
    assert sorted(msgs(end, m.TopologyOptimized)) == [x, y]
    assert sorted(msgs(end, m.Membership)) == [a, b, x, y]  # one epoch for the whole run
    (ma,) = sent_to(end, a, m.Membership)
    assert ring_ids(ma) == [a, b]  # type: ignore[arg-type]


def test_a_group_of_one_answers_at_once() -> None:
    h = Harness()
    (a,) = h.run(0)
    got = answer(h.send(a, m.VoteOptimize()), a)
    assert (got.ring, got.measured, got.bottleneck_bps) == ([a], 0, 0.0)


def test_a_large_group_s_ring_improves_in_the_background_and_the_next_call_takes_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the switch finds nothing better than join order: the background search has to
    monkeypatch.setattr(topology.tour, "solve", lambda cost, budget: list(range(len(cost))))
    rng = random.Random(19)
    h = Harness(heartbeat_timeout=1e9)
    peers = h.run(*[0] * 14)
    rates = {(a, b): rng.uniform(10e6, 1e9) for a in peers for b in peers if a != b}
    _, acts = drive(h, vote_all(h, peers), lambda a, b: rates[(a, b)])
    first = answer(acts, peers[0])
    for t in range(1, 40):
        h.tick(float(t))
    rounds, acts = drive(h, vote_all(h, peers))
    second = answer(acts, peers[0])
    assert rounds == [] and second.measured == 0
    assert second.bottleneck_bps > first.bottleneck_bps
    assert first.ring == peers and sorted(second.ring) == peers and h.st.ring(0) == second.ring


def test_the_departure_of_the_last_non_voter_starts_the_measurement() -> None:
    h = Harness()
    a, b, c = h.run(0, 0, 0)
    assert vote_all(h, [a, b]) == []
    _, end = drive(h, h.disconnect(c))
    got = answer(end, a)
    assert answer(end, b) == got and sorted(got.ring) == [a, b] and got.measured == 2
