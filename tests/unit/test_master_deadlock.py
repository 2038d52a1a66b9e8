"""Deadlock detection in the sans-IO master (``core/deadlock.py``, applied by ``state.py``).

Peers that wait on each other forever (different tags, different votes, a collective a peer
never launches while it is blocked elsewhere) all fail at once: every vote of theirs gets
``VoteRejected(deadlock=True)`` and every unstarted collective they await gets
``CollectiveRejected(deadlock=True)`` for everyone who launched it. A free peer (computing: no
counted vote, no awaited collective) may still act, so nothing fires while one can help,
unless the vote it misses is one it cannot cast: a topology or sync vote next to a launch of
its that waits for a deadlocked peer. The older conflict rule for ``update_topology()`` next to
a pending vote or a launch that needs no topology voter is tested in test_master_membership.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterable

import pytest

from pccl_aio._master.core import deadlock
from pccl_aio._master.core import state as ms
from pccl_aio._wire import messages as m
from tests.unit.master_harness import (
    DEPARTURES,
    Harness,
    assert_kicked,
    departure,
    msgs,
    run_with_silent,
    sync_vote,
)

pytestmark = pytest.mark.timeout(60)
SAME = "; all peers must make the same calls in the same order"


def launch(h: Harness, conn: int, tag: int, wait: bool = True) -> list[ms.Action]:
    """``conn`` calls ``all_reduce(tag=tag)``: its vote, then (``wait``) it awaits it."""
    acts = h.send(conn, m.CollectiveInit(tag, 8, 10, 0))
    return acts + h.send(conn, m.CollectiveWait(tag)) if wait else acts


def answers(acts: list[ms.Action]) -> dict[int, list[object]]:
    """conn -> the deadlock answers it got (VoteRejected / CollectiveRejected, deadlock set)."""
    out: dict[int, list[object]] = {}
    for a in acts:
        if isinstance(a, ms.Send) and getattr(a.msg, "deadlock", False):
            out.setdefault(a.conn, []).append(a.msg)
    return out


def calls(acts: list[ms.Action]) -> dict[int, set[str | int]]:
    """conn -> its failed calls: a vote's kind, or a collective's tag."""
    return {c: {x.kind if isinstance(x, m.VoteRejected) else x.tag for x in v}
            for c, v in answers(acts).items()}


def reason(acts: list[ms.Action]) -> str:
    reasons = {x.reason for v in answers(acts).values() for x in v}
    assert len(reasons) == 1, reasons
    return reasons.pop()


def complete(h: Harness, conns: list[int], tag: int) -> None:
    """The peers are usable again: ``tag`` runs and completes for all of them."""
    seq = h.start(conns, tag)
    acts: list[ms.Action] = []
    for c in conns:
        acts += h.send(c, m.CollectiveDone(tag, seq, True))
    assert sorted(msgs(acts, m.CollectiveComplete)) == sorted(conns)


# ---- the cases of issue 16 -----------------------------------------------------------------------


def test_two_peers_awaiting_different_tags_both_fail_at_once() -> None:
    h = Harness()
    a, b = h.run(0, 0)
    assert launch(h, a, 1) == []  # b may still be computing
    assert launch(h, b, 2, wait=False) == []  # b launched tag 2 but does not wait on it yet
    acts = h.send(b, m.CollectiveWait(2))
    assert calls(acts) == {a: {1}, b: {2}}
    assert all(isinstance(x, m.CollectiveRejected) for v in answers(acts).values() for x in v)
    assert reason(acts) == ("deadlock: peer 1 waits in all_reduce(tag=1), which peer 2 never "
                            "launched; peer 2 waits in all_reduce(tag=2), which peer 1 never "
                            "launched" + SAME)
    assert [x for x in acts if not getattr(x.msg, "deadlock", False)] == []
    complete(h, [a, b], 1)
    complete(h, [a, b], 2)


def test_a_launch_awaited_in_the_same_message_waits_as_if_a_wait_followed() -> None:
    """``CollectiveInit(awaited=True)`` (the peer's launch when its caller already waits)
    counts its ``CollectiveWait``: the second such launch of another tag is a deadlock."""
    h = Harness()
    a, b = h.run(0, 0)
    assert h.send(a, m.CollectiveInit(1, 8, 10, 0, awaited=True)) == []
    acts = h.send(b, m.CollectiveInit(2, 8, 10, 0, awaited=True))
    assert calls(acts) == {a: {1}, b: {2}}
    assert reason(acts).startswith("deadlock: peer 1 waits in all_reduce(tag=1)")
    complete(h, [a, b], 1)


def test_pending_vote_next_to_a_sync_vote_both_fail() -> None:
    h = Harness()
    a, b = h.run(0, 0)
    assert h.send(a, m.VotePeersPending()) == []
    acts = h.send(b, sync_vote())
    assert answers(acts) == {
        a: [m.VoteRejected("pending", reason(acts), True)],
        b: [m.VoteRejected("sync", reason(acts), True)]}
    assert reason(acts) == ("deadlock: peer 1 waits in are_peers_pending(); "
                            "peer 2 waits in sync_shared_state()" + SAME)
    # both votes are gone: the next sync needs both votes again, and then runs
    assert h.send(a, sync_vote()) == []
    assert sorted(msgs(h.send(b, sync_vote()), m.SyncPlan)) == [a, b]


@pytest.mark.parametrize("topology_first", [True, False])
def test_topology_vote_next_to_a_launch_that_needs_it_fails_alone(topology_first: bool) -> None:
    """b launched tag 3 and computes: it cannot vote for the topology before tag 3 starts,
    which needs a, who waits in update_topology(): a fails alone, at once (b is not blocked),
    and b's collective waits for a to follow."""
    h = Harness()
    a, b = h.run(0, 0)
    if topology_first:
        assert h.send(a, m.VoteUpdateTopology()) == []
        acts = launch(h, b, 3, wait=False)
    else:
        assert launch(h, b, 3, wait=False) == []
        acts = h.send(a, m.VoteUpdateTopology())
    assert calls(acts) == {a: {"topology"}} and len(acts) == 1
    assert reason(acts) == ("deadlock: peer 1 waits in update_topology(), which peer 2 cannot "
                            "join before its all_reduce(tag=3) starts" + SAME)
    assert h.send(b, m.CollectiveWait(3)) == []  # a is free again: it may follow
    assert sorted(msgs(launch(h, a, 3), m.CollectiveStart)) == [a, b]


def test_sync_vote_next_to_a_launch_that_needs_it_fails_alone() -> None:
    h = Harness()
    a, b = h.run(0, 0)
    assert launch(h, b, 1, wait=False) == []
    acts = h.send(a, sync_vote())
    assert calls(acts) == {a: {"sync"}}
    assert reason(acts) == ("deadlock: peer 1 waits in sync_shared_state(), which peer 2 "
                            "cannot join before its all_reduce(tag=1) starts" + SAME)
    assert sorted(msgs(launch(h, a, 1), m.CollectiveStart)) == [a, b]


def test_topology_vote_next_to_a_launch_that_needs_none_of_it_fails_alone() -> None:
    """The conflict rule (``deadlock.conflict``): x and y of group 1 launched tag 1, which can
    start without a; a's update_topology() fails alone, at once (deadlock False)."""
    h = Harness()
    a, _, x, y = h.run(0, 0, 1, 1)
    assert launch(h, y, 1) == []
    acts = h.send(a, m.VoteUpdateTopology())
    assert answers(acts) == {} and len(acts) == 1
    (rej,) = msgs(acts, m.VoteRejected)[a]
    assert rej.kind == "topology" and not rej.deadlock and "same calls" in rej.reason
    assert sorted(msgs(launch(h, x, 1), m.CollectiveStart)) == [x, y]


def test_topology_vote_next_to_an_awaited_all_reduce_both_fail() -> None:
    h = Harness()
    a, b = h.run(0, 0)
    assert launch(h, b, 3) == []
    acts = h.send(a, m.VoteUpdateTopology())
    assert calls(acts) == {a: {"topology"}, b: {3}}
    assert reason(acts) == ("deadlock: peer 1 waits in update_topology(); peer 2 waits in "
                            "all_reduce(tag=3), which peer 1 never launched" + SAME)
    complete(h, [a, b], 3)
    assert h.send(a, m.VoteUpdateTopology()) == []
    assert sorted(msgs(h.send(b, m.VoteUpdateTopology()), m.TopologyUpdated)) == [a, b]


def _orders() -> list[tuple[str, ...]]:
    """Every arrival order of p0's and p1's launch+wait and p2's topology vote."""
    steps = ("0 init", "0 wait", "1 init", "1 wait", "2 vote")
    return [o for o in itertools.permutations(steps)
            if o.index("0 init") < o.index("0 wait") and o.index("1 init") < o.index("1 wait")]


@pytest.mark.parametrize("order", _orders(), ids=" -> ".join)
def test_peer_in_update_topology_never_launches_what_the_others_await(
        order: tuple[str, ...]) -> None:
    """Issue 16's "never" case in every arrival order: all three fail with the deadlock once
    both launched and p2 voted, unless neither launcher awaits tag 0 yet at that moment: then
    the topology call fails alone (both launchers still compute). A peer that sends its
    launch and its wait at once never leaves that window open."""
    h = Harness()
    peers = h.run(0, 0, 0)
    acts: list[ms.Action] = []
    for step in order:
        who, what = step.split()
        c = peers[int(who)]
        if what == "vote":
            acts += h.send(c, m.VoteUpdateTopology())
        else:
            acts += launch(h, c, 0, wait=False) if what == "init" else h.send(
                c, m.CollectiveWait(0))
    p0, p1, p2 = peers
    last = max(order.index(x) for x in ("0 init", "1 init", "2 vote"))
    if order.index("0 wait") > last and order.index("1 wait") > last:
        assert calls(acts) == {p2: {"topology"}}  # nobody awaited tag 0 yet: as above
        assert sorted(msgs(launch(h, p2, 0), m.CollectiveStart)) == peers  # p2 follows
    else:
        assert calls(acts) == {p0: {0}, p1: {0}, p2: {"topology"}}
        assert "peer 3 waits in update_topology()" in reason(acts)
        complete(h, peers, 0)


def test_topology_vote_next_to_a_sync_vote_both_fail() -> None:
    h = Harness()
    a, b = h.run(0, 0)
    assert h.send(a, sync_vote()) == []
    acts = h.send(b, m.VoteUpdateTopology())
    assert calls(acts) == {a: {"sync"}, b: {"topology"}}
    assert reason(acts) == ("deadlock: peer 1 waits in sync_shared_state(); "
                            "peer 2 waits in update_topology()" + SAME)
    h.send(a, m.VoteUpdateTopology())
    assert sorted(msgs(h.send(b, m.VoteUpdateTopology()), m.TopologyUpdated)) == [a, b]


def test_peer_that_never_launches_while_blocked_elsewhere_fails_with_the_waiters() -> None:
    h = Harness()
    a, b, c = h.run(0, 0, 0)
    assert launch(h, a, 1) == []
    assert launch(h, b, 1) == []  # c is computing: it may still launch tag 1
    acts = h.send(c, m.VotePeersPending())  # ... but it went to are_peers_pending() instead
    assert calls(acts) == {a: {1}, b: {1}, c: {"pending"}}
    assert reason(acts) == ("deadlock: peer 1 waits in all_reduce(tag=1), which peer 3 never "
                            "launched; peer 2 waits in all_reduce(tag=1), which peer 3 never "
                            "launched; peer 3 waits in are_peers_pending()" + SAME)
    complete(h, [a, b, c], 1)


def test_several_missing_peers_are_named() -> None:
    h = Harness()
    a, b, c = h.run(0, 0, 0)
    assert h.send(b, m.VotePeersPending()) == []
    assert h.send(c, m.VotePeersPending()) == []
    acts = launch(h, a, 7)
    assert "peer 1 waits in all_reduce(tag=7), which peers 2, 3 never launched" in reason(acts)


# ---- free peers prevent it -----------------------------------------------------------------------


def test_a_free_peer_prevents_it() -> None:
    h = Harness()
    a, b = h.run(0, 0)
    assert launch(h, a, 1) == []  # b computes: it may launch tag 1 any time
    assert launch(h, b, 2, wait=False) == []  # launched, not awaited: still computing
    assert h.send(a, m.Heartbeat()) == []
    assert h.st.running(0) == {}
    acts = launch(h, b, 1)  # b launches tag 1 after all: it starts
    assert sorted(msgs(acts, m.CollectiveStart)) == [a, b] and answers(acts) == {}


def test_fixpoint_three_peers_where_one_is_free() -> None:
    """a waits in are_peers_pending(), which needs b and c; b awaits tag 1, which needs a.
    c is free, so a may still be answered, so b may still go on: nothing fires. Once c is
    blocked too, the three wait forever."""
    h = Harness()
    a, b, c = h.run(0, 0, 1)
    assert h.send(a, m.VotePeersPending()) == []
    assert launch(h, b, 1) == []
    assert h.send(c, m.Heartbeat()) == []  # c computes
    acts = h.send(c, m.VotePeersPending())
    assert calls(acts) == {a: {"pending"}, b: {1}, c: {"pending"}}


def test_fixpoint_a_free_peer_two_hops_away_prevents_it() -> None:
    """a -> pending (needs b, c, x); b -> tag 1 (needs a); c -> tag 5 of group 1 (needs x);
    x is free. x may launch tag 5, so c may go on, so a may be answered, so b too."""
    h = Harness()
    a, b, c, x = h.run(0, 0, 1, 1)
    assert launch(h, c, 5) == []
    assert h.send(a, m.VotePeersPending()) == []
    assert launch(h, b, 1) == []
    assert answers(launch(h, x, 6, wait=False)) == {}  # x launches something else, not waiting
    acts = h.send(x, m.CollectiveWait(6))  # now x is blocked too: everyone is
    assert calls(acts) == {a: {"pending"}, b: {1}, c: {5}, x: {6}}


def test_syncing_peer_waiting_for_completion_is_not_blocked() -> None:
    h = Harness()
    a, b, c = h.run(0, 0, 1)
    assert h.send(c, sync_vote()) != []  # alone in group 1: its sync runs at once
    h.send(a, sync_vote())
    assert sorted(msgs(h.send(b, sync_vote()), m.SyncPlan)) == [a, b]
    assert h.send(a, m.SyncDone(True)) == []  # a waits for b's SyncDone: no vote needed
    assert h.send(c, m.SyncDone(True)) != []  # c's sync completes
    acts = h.send(c, m.VotePeersPending())  # needs a and b, who are syncing: they will come
    assert answers(acts) == {}
    assert sorted(msgs(h.send(b, m.SyncDone(True)), m.SyncComplete)) == [a, b]
    h.send(a, m.VotePeersPending())
    assert sorted(msgs(h.send(b, m.VotePeersPending()), m.PeersPendingAnswer)) == [a, b, c]


# ---- groups --------------------------------------------------------------------------------------


def test_a_deadlock_in_one_group_fires_while_the_other_group_computes() -> None:
    h = Harness()
    a, b, x, y = h.run(0, 0, 1, 1)
    assert launch(h, a, 1) == []
    acts = launch(h, b, 2)
    assert calls(acts) == {a: {1}, b: {2}}
    assert launch(h, x, 1) == []  # group 1's tag 1 is another collective
    assert sorted(msgs(launch(h, y, 1), m.CollectiveStart)) == [x, y]


def test_global_vote_waits_for_free_peers_of_another_group() -> None:
    h = Harness()
    a, b, x, y = h.run(0, 0, 1, 1)
    assert h.send(a, m.VotePeersPending()) == []
    assert h.send(b, sync_vote()) == []  # b's sync needs a; a's vote needs x and y: free
    assert h.send(x, sync_vote()) == []  # group 1's sync needs y, who is still free
    acts = h.send(y, m.VotePeersPending())  # now nobody is free
    assert calls(acts) == {a: {"pending"}, b: {"sync"}, x: {"sync"}, y: {"pending"}}


def test_every_launcher_of_a_rejected_collective_is_answered_awaiting_or_not() -> None:
    h = Harness()
    a, b, c = h.run(0, 0, 0)
    assert launch(h, b, 1, wait=False) == []  # b launched tag 1, then awaits tag 3 instead
    assert launch(h, a, 1) == []
    assert launch(h, b, 3) == []
    acts = launch(h, c, 2)
    assert calls(acts) == {a: {1}, b: {1, 3}, c: {2}}
    for t in (1, 2, 3):
        complete(h, [a, b, c], t)


# ---- when it is checked --------------------------------------------------------------------------


@pytest.mark.parametrize("how", DEPARTURES)
def test_departure_of_the_only_free_peer_reveals_a_deadlock(how: str) -> None:
    h = Harness()
    a, b, c = run_with_silent(h, (0, 0, 1), 2)
    assert launch(h, a, 1) == []
    assert h.send(b, m.VotePeersPending()) == []  # needs a and c; c is free
    acts = departure(h, how, c)
    assert calls(acts) == {a: {1}, b: {"pending"}}


def test_withdrawing_one_of_two_waits_can_reveal_a_deadlock() -> None:
    """a awaits are_peers_pending() and tag 1 at once (two tasks); its pending vote may still
    be answered (c is free), so a counts as able to go on. Cancelling it leaves a on tag 1."""
    h = Harness()
    a, b, c = h.run(0, 0, 1)
    assert h.send(a, m.VotePeersPending()) == []
    assert launch(h, a, 1) == []
    assert launch(h, b, 2) == []
    acts = h.send(a, m.WithdrawVote("pending"))
    assert calls(acts) == {a: {1}, b: {2}}
    assert c in h.st.accepted()


def test_collective_wait_on_a_started_or_unknown_tag_is_ignored() -> None:
    h = Harness()
    a, b, c = h.run(0, 0, 0)
    h.start([a, b, c], 1)
    assert h.send(a, m.CollectiveWait(1)) == []  # raced with the start
    assert h.send(a, m.CollectiveWait(9)) == []  # never launched (or aborted meanwhile)
    assert launch(h, b, 4) == []
    assert h.send(c, m.CollectiveWait(4)) == []  # launched by b, not by c: not c's wait
    assert h.send(b, m.CollectiveWait(4)) == []  # a second wait: the same
    acts = launch(h, c, 5)  # c awaits 5; a is free: nothing yet
    assert answers(acts) == {}
    acts = launch(h, a, 6)
    assert calls(acts) == {a: {6}, b: {4}, c: {5}}


def test_collective_wait_after_an_abort_is_ignored() -> None:
    h = Harness()
    a, b = h.run(0, 0)
    assert launch(h, a, 1, wait=False) == []
    acts = h.send(a, m.CollectiveDone(1, 0, False, "cancelled"))  # withdrawn before it started
    assert sorted(msgs(acts, m.CollectiveAbort)) == [a]
    assert h.send(a, m.CollectiveWait(1)) == []
    assert launch(h, b, 1) == []  # a fresh tag 1 of b's: a's stale wait did not count
    assert sorted(msgs(launch(h, a, 1), m.CollectiveStart)) == [a, b]


def test_collective_wait_before_hello_or_from_a_pending_peer_is_a_protocol_error() -> None:
    h = Harness()
    a, b = h.run(0, 0)
    u = h.connect()
    acts = h.send(u, m.CollectiveWait(1))
    assert_kicked(acts, u)
    assert "CollectiveWait before Hello" in acts[0].msg.reason
    p, _ = h.join(0)
    assert_kicked(h.send(p, m.CollectiveWait(1)), p)
    assert h.st.accepted() == [a, b] and h.st.pending() == []


# ---- the rule on its own (a Board of plain data) -------------------------------------------------


class _Board:
    def __init__(self, members: dict[int, int],
                 waits: list[tuple[deadlock.Item, list[int], list[int]]]) -> None:
        self._members, self._waits = members, waits

    def members(self) -> dict[int, int]:
        return self._members

    def waits(self) -> Iterable[tuple[deadlock.Item, Collection[int], Collection[int]]]:
        return self._waits


def test_find_without_waiters_is_none() -> None:
    assert deadlock.find(_Board({1: 0, 2: 0}, [])) is None
    assert deadlock.find(_Board({1: 0, 2: 0}, [(("collective", 0, 1), [1], [])])) is None


def test_an_item_that_misses_nobody_is_about_to_complete() -> None:
    board = _Board({1: 0, 2: 0}, [(("topology", 0, 0), [1, 2], [1, 2])])
    assert deadlock.find(board) is None


def test_find_names_the_first_peers_and_counts_the_rest() -> None:
    members = dict.fromkeys(range(1, 13), 0)
    waits: list[tuple[deadlock.Item, list[int], list[int]]] = [
        (("collective", 0, c), [c], [c]) for c in members]
    found = deadlock.find(_Board(members, waits))
    assert found is not None and sorted(found.waits) == list(members)
    text = found.reason()
    assert "peer 8 waits" in text and "peer 9 waits" not in text
    assert text.endswith("; and 4 more peers" + SAME)
    assert "which peers 2, 3, 4, 5, 6, 7, 8, 9 and more never launched" in text


def test_conflict_needs_topology_voters_and_a_busy_peer() -> None:
    topo: tuple[deadlock.Item, list[int], list[int]] = (("topology", 0, 0), [1], [1])
    assert deadlock.conflict(_Board({1: 0, 2: 0}, [topo])) is None
    assert deadlock.conflict(_Board({1: 0, 2: 0}, [topo, (("sync", 0, 0), [2], [2])])) is None
    clash = deadlock.conflict(_Board({1: 0, 2: 0}, [topo, (("pending", 0, 0), [2], [2])]))
    assert clash is not None and clash[0] == [1] and "update_topology()" in clash[1]
