"""The sans-IO master's bounds against hostile clients and members (``core/limits.py``).

Each test says what it checks; each would fail without the bound it names: per-member
collectives, the Hello deadline, the cap on joiners, the liveness rule and the batches of the
pending answer (a Hello flood against a README-style loop), ``advertise_host`` validation and
the wire's length caps. Harness: ``master_harness``.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
import pytest

from pccl_aio._errors import RemoteProtocolError
from pccl_aio._master.core import state as ms
from pccl_aio._wire import messages as m
from tests.unit.master_harness import (
    RUN,
    Harness,
    assert_kicked,
    closes,
    msgs,
    ring_ids,
    sent_to,
    sync_vote,
    welcome,
)


def harness(**options: Any) -> Harness:
    h = Harness()
    h.st = ms.MasterState(**options, run_id=RUN)
    return h


# ---- collectives per member ----------------------------------------------------------------------


def test_a_flood_of_distinct_collective_inits_kicks_the_member_and_frees_its_operations() -> None:
    """300 000 distinct tags from one member: the master holds at most the cap (1024) of them,
    the member is kicked at the 1025th, its launches go, and the next membership change
    touches no operation. Without the cap the master held 300 000 ``Op``s."""
    h = harness()
    a, b = h.run(0, 0)
    cap = h.st.limits.max_collectives_per_peer
    assert cap == 1024
    for tag in range(1, cap + 1):
        assert h.send(a, m.CollectiveInit(tag, 8, 10, 0)) == []  # legal: waits for b
    assert len(h.st.access.collectives()) == cap
    acts = h.send(a, m.CollectiveInit(cap + 1, 8, 10, 0))
    assert_kicked(acts, a)
    assert "1024 collectives" in acts[0].msg.reason  # type: ignore[union-attr]
    assert h.st.access.collectives() == {} and h.st.accepted() == [b]
    for tag in range(cap + 2, 300_001):  # the rest of the flood reaches a closed session
        assert h.st.handle(ms.Received(a, m.CollectiveInit(tag, 8, 10, 0), h.now)) == []
    assert h.st.access.collectives() == {}
    c, _ = h.join(0)  # the next membership change: no operation to walk through
    acts = h.send(b, m.VoteUpdateTopology())
    assert sorted(msgs(acts, m.Membership)) == [b, c] and h.st.access.collectives() == {}
    assert h.start([b, c], 7) > 0  # the survivors go on


def test_the_cap_counts_running_and_voting_collectives_and_frees_a_slot_when_one_ends() -> None:
    """With a cap of 2: two launches are legal (one running, one voting); a third kicks;
    once one ended, a third launch is legal again."""
    h = harness(max_collectives_per_peer=2)
    a, b = h.run(0, 0)
    seq = h.start([a, b], 1)  # running
    assert h.send(a, m.CollectiveInit(2, 8, 10, 0)) == []  # voting
    h.send(a, m.CollectiveDone(1, seq, True))
    acts = h.send(b, m.CollectiveDone(1, seq, True))
    assert sorted(msgs(acts, m.CollectiveComplete)) == [a, b]
    assert h.send(a, m.CollectiveInit(3, 8, 10, 0)) == []  # tag 1 ended: room again
    assert_kicked(h.send(a, m.CollectiveInit(4, 8, 10, 0)), a)


def test_a_sync_vote_is_one_per_member() -> None:
    """Nothing else a member sends accumulates: a second sync vote while one is counted is a
    protocol error (the barrier holds one vote per peer)."""
    h = harness()
    a, _b = h.run(0, 0)
    assert h.send(a, sync_vote()) == []
    assert_kicked(h.send(a, sync_vote(content=2)), a)


# ---- Hello deadline ------------------------------------------------------------------------------


def test_a_connection_that_only_heartbeats_is_closed_when_it_said_no_hello_in_time() -> None:
    """Heartbeats keep a connection alive but do not register it: without ``Hello`` within
    ``hello_timeout`` it is closed on a Tick (before, it lived for ever)."""
    h = harness(hello_timeout=5.0)
    u = h.connect()
    (a,) = h.run(0)
    for now in (1.0, 2.0, 3.0, 4.0, 5.0):
        h.now = now
        h.send(u, m.Heartbeat())
        h.send(a, m.Heartbeat())
        assert closes(h.tick(now)) == []  # 5.0 s: not more than hello_timeout yet
    h.send(u, m.Heartbeat())
    h.send(a, m.Heartbeat())
    acts = h.tick(5.5)
    assert acts[0] == ms.Close(u, "no Hello within 5 s") and closes(acts) == [u]
    assert sent_to(acts, a) == [m.MasterHeartbeat()]
    assert h.st.accepted() == [a]


def test_a_hello_in_time_ends_the_deadline() -> None:
    h = harness(hello_timeout=1.0)
    u = h.connect()
    h.now = 0.9
    h.hello(u)
    h.now = 3.0
    h.send(u, m.Heartbeat())
    assert closes(h.tick(3.0)) == []
    assert h.st.accepted() == [u]


# ---- joiners: the cap, liveness, batches ---------------------------------------------------------


def test_joiners_are_capped_and_the_next_hello_is_rejected() -> None:
    """``max_pending_peers`` joiners wait; one more gets ``Rejected`` and is closed; a
    departure or an admission makes room."""
    h = harness(max_pending_peers=3)
    (a,) = h.run(0)
    joiners = [h.join(0)[0] for _ in range(3)]
    assert h.st.pending() == joiners
    x, acts = h.join(0)
    assert acts == [ms.Send(x, m.Rejected("too many peers waiting to join")),
                    ms.Close(x, "too many peers waiting to join")]
    assert h.st.pending() == joiners
    h.disconnect(joiners[0])
    y, acts = h.join(0)
    assert acts == [ms.Send(y, welcome(y, False))]
    h.send(a, m.VoteUpdateTopology())
    assert h.st.pending() == [] and h.st.accepted() == [a, *joiners[1:], y]
    assert len([h.join(0) for _ in range(3)]) == 3 and len(h.st.pending()) == 3


def test_a_joiner_counts_as_pending_once_heard_from_after_its_hello() -> None:
    """A ``Hello`` alone does not make ``are_peers_pending()`` True; the joiner's first
    heartbeat does (a communicator sends one every heartbeat interval)."""
    h = harness()
    (a,) = h.run(0)
    p, _ = h.join(0)
    assert h.send(a, m.VotePeersPending()) == [ms.Send(a, m.PeersPendingAnswer(False))]
    h.send(p, m.Heartbeat())
    assert h.send(a, m.VotePeersPending()) == [ms.Send(a, m.PeersPendingAnswer(True))]


def test_a_joiner_that_leaves_before_admission_is_forgotten_without_work() -> None:
    h = harness()
    a, b = h.run(0, 0)
    epoch = h.st.epoch
    p, _ = h.join(0)
    h.send(p, m.Heartbeat())
    assert h.disconnect(p) == []
    h.send(a, m.VotePeersPending())
    acts = h.send(b, m.VotePeersPending())
    assert acts == [ms.Send(x, m.PeersPendingAnswer(False)) for x in (a, b)]
    assert h.st.epoch == epoch and h.st.pending() == []


def test_pending_answers_come_in_batches_one_per_admission_interval() -> None:
    """After a True answer the next one waits ``admission_interval``: a stream of joiners
    costs the group at most one topology round per interval."""
    h = harness(admission_interval=1.0)
    (a,) = h.run(0)

    def joiner() -> int:
        p, _ = h.join(0)
        h.send(p, m.Heartbeat())
        return p

    p = joiner()
    assert sent_to(h.send(a, m.VotePeersPending()), a) == [m.PeersPendingAnswer(True)]
    h.send(a, m.VoteUpdateTopology())
    assert h.st.accepted() == [a, p]
    h.now = 0.5
    q = joiner()
    h.send(a, m.VotePeersPending())
    assert sent_to(h.send(p, m.VotePeersPending()), a) == [m.PeersPendingAnswer(False)]
    h.now = 1.0
    h.send(a, m.VotePeersPending())
    assert sent_to(h.send(p, m.VotePeersPending()), a) == [m.PeersPendingAnswer(True)]
    assert h.st.pending() == [q]


class _Loop:
    """Two members running the README loop on the harness, 10 ms per iteration: vote
    ``are_peers_pending()``; if True ``update_topology()``, else one all-reduce."""

    def __init__(self, h: Harness) -> None:
        self.h = h
        self.a, self.b = h.run(0, 0)
        self.reduces = self.rounds = 0
        self.tag = 0

    def step(self) -> None:
        h = self.h
        members = h.st.accepted()
        acts: list[ms.Action] = []
        for c in members:
            acts += h.send(c, m.VotePeersPending())
        answers = msgs(acts, m.PeersPendingAnswer)
        if answers.get(self.a) == [m.PeersPendingAnswer(True)]:
            self.rounds += 1
            for c in h.st.accepted():
                h.send(c, m.VoteUpdateTopology())
            return
        self.tag += 1
        starts = msgs(h.init([self.a, self.b], self.tag), m.CollectiveStart)
        if sorted(starts) == [self.a, self.b]:
            (start,) = starts[self.a]
            for c in (self.a, self.b):
                h.send(c, m.CollectiveDone(self.tag, start.seq, True))  # type: ignore[attr-defined]
            self.reduces += 1


@pytest.mark.parametrize("flood", ["hello, close", "hello, stay silent", "hello, heartbeat, close"])
def test_a_hello_flood_does_not_stop_a_readme_loop(flood: str) -> None:
    """Five new connections say ``Hello`` every iteration of a README-style loop (10 s of
    it). Before, every ``are_peers_pending()`` answered True and every iteration was a
    topology round (0 all-reduces); silent joiners admitted that way stalled the group. Now
    Hello-only joiners never count, and live ones cost at most one round per
    ``admission_interval``: at least 90 % of the iterations reduce."""
    h = harness()
    loop = _Loop(h)
    iterations = 1000
    for i in range(iterations):
        h.now = i * 0.01
        flooders = [h.connect() for _ in range(5)]
        for f in flooders:
            acts = h.hello(f)
            if not sent_to(acts, f, m.Welcome):
                continue  # rejected: joiners are capped
            if flood == "hello, heartbeat, close":
                h.send(f, m.Heartbeat())
        loop.step()
        if flood != "hello, stay silent":
            for f in flooders:
                if f not in h.closed:
                    h.disconnect(f)
        if i % 50 == 0:
            for c in h.st.accepted():
                h.send(c, m.Heartbeat())
            h.tick(h.now)
        # fail fast (a broken bound would make the rest slow): few rounds, few members
        assert loop.rounds <= 1 + h.now / h.st.limits.admission_interval
        assert len(h.st.accepted()) <= 2 + len(flooders)
        assert len(h.st.pending()) <= h.st.limits.max_pending_peers
    assert loop.reduces >= 0.9 * iterations, (loop.reduces, loop.rounds)
    assert loop.rounds <= 11  # one per admission_interval at most
    assert h.st.accepted()[:2] == [loop.a, loop.b]


# ---- advertise_host ------------------------------------------------------------------------------


@pytest.mark.parametrize(("host", "advertised"), [
    ("10.0.0.2", ""),
    ("10.0.0.2", "10.0.0.2"),
    ("10.0.0.2", "::ffff:10.0.0.2"),
    ("::ffff:10.0.0.2", "10.0.0.2"),
    ("2001:db8::1", "2001:DB8:0:0::1"),
])
def test_advertise_host_may_be_empty_or_the_connections_own_address(host: str,
                                                                     advertised: str) -> None:
    h = harness()
    a, _ = h.join(0, host="10.0.0.1")
    p, acts = h.join(0, host=host, advertise_host=advertised)
    assert acts == [ms.Send(p, welcome(p, False))]
    (mm,) = sent_to(h.send(a, m.VoteUpdateTopology()), p, m.Membership)
    assert mm.ring[1].host == (advertised or host)


@pytest.mark.parametrize(("advertised", "words"), [
    ("10.9.9.9", "is not this connection's address 10.0.0.2"),
    ("peer.example.org", "is not an IP address"),
    ("10.0.0.2x", "is not an IP address"),
])
def test_advertise_host_elsewhere_is_rejected_with_a_reason(advertised: str, words: str) -> None:
    """A joiner cannot point the others' traffic at another host (issue 17)."""
    h = harness()
    h.join(0, host="10.0.0.1")
    p, acts = h.join(0, host="10.0.0.2", advertise_host=advertised)
    assert [type(x) for x in acts] == [ms.Send, ms.Close] and closes(acts) == [p]
    assert isinstance(acts[0].msg, m.Rejected)  # type: ignore[union-attr]
    assert words in acts[0].msg.reason and "advertise_host" in acts[0].msg.reason  # type: ignore[union-attr]
    assert h.st.pending() == []


def test_allow_any_advertise_host_lets_a_joiner_announce_another_address() -> None:
    h = harness(allow_any_advertise_host=True)
    a, _ = h.join(0, host="10.0.0.1")
    p, _ = h.join(0, host="10.0.0.2", advertise_host="peer.example.org")
    (mm,) = sent_to(h.send(a, m.VoteUpdateTopology()), p, m.Membership)
    assert ring_ids(mm) == [a, p] and mm.ring[1].host == "peer.example.org"


# ---- wire caps -----------------------------------------------------------------------------------


def _body(*fields: object) -> bytes:
    return msgspec.msgpack.encode(list(fields))


@pytest.mark.parametrize(("name", "make", "limit"), [
    ("Hello.advertise_host", lambda s: _body(1, 1, 0, 5000, s), 253),
    ("CollectiveDone.reason", lambda s: _body(6, 1, 1, False, s), 1024),
    ("SyncDone.reason", lambda s: _body(9, False, s), 1024),
    ("VoteSync.entries[0].key", lambda s: _body(8, 0, 0, [[s, 1, 1, b""]]), 4096),
])
def test_strings_a_peer_sends_are_capped_at_decode(name: str, make: Any, limit: int) -> None:
    m.decode_peer_to_master(make("x" * limit))
    with pytest.raises(RemoteProtocolError, match=re.escape(name)):
        m.decode_peer_to_master(make("x" * (limit + 1)))


def test_sync_vote_entries_are_capped_at_decode() -> None:
    entry = ["k", 1, 1, b""]
    assert m.MAX_SYNC_ENTRIES == 1 << 20
    m.decode_peer_to_master(_body(8, 0, 0, [entry] * 1000))
    with pytest.raises(RemoteProtocolError, match=re.escape(
            "VoteSync.entries: Expected `array` of length <= 1048576")):
        m.decode_peer_to_master(_body(8, 0, 0, [entry] * (m.MAX_SYNC_ENTRIES + 1)))
