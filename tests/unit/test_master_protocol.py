"""Liveness and protocol rules of the sans-IO master: heartbeats, protocol versions,
malformed input, loopback mixing, and every illegal message (kicks only the offender).
Harness: ``master_harness``.
"""

from __future__ import annotations

import dataclasses

import msgspec
import pytest

from pccl_aio._master.core import state as ms
from pccl_aio._wire import messages as m
from tests.unit.master_harness import (
    PV,
    RUN,
    Harness,
    assert_kicked,
    closes,
    msgs,
    sent_to,
    welcome,
)

# ---- heartbeat ----------------------------------------------------------------------------------


def test_tick_within_timeout_sends_one_master_heartbeat_to_every_connection() -> None:
    h = Harness(heartbeat_timeout=5.0)
    a, b = h.run(0, 0)
    p, _ = h.join(0)
    u = h.connect()  # no Hello yet
    acts = h.tick(4.9)
    assert sorted(a_.conn for a_ in acts) == [a, b, p, u]
    assert all(isinstance(a_, ms.Send) and isinstance(a_.msg, m.MasterHeartbeat) for a_ in acts)


def test_any_message_refreshes_liveness() -> None:
    h = Harness(heartbeat_timeout=5.0)
    a, b = h.run(0, 0)
    h.now = 4.0
    h.send(a, m.Heartbeat())
    h.send(b, m.VotePeersPending())
    acts = h.tick(8.0)
    assert closes(acts) == []
    acts = h.tick(9.5)
    assert closes(acts) == [a, b]


def test_silent_peer_is_closed_and_treated_as_dead() -> None:
    h = Harness(heartbeat_timeout=5.0)
    a, b, c = h.run(0, 0, 0)
    seq = h.start([a, b, c], 1)
    h.now = 4.0
    h.send(a, m.Heartbeat())
    h.send(c, m.Heartbeat())
    h.now = 8.0
    h.send(a, m.Heartbeat())
    h.send(c, m.Heartbeat())
    acts = h.tick(8.5)
    assert acts[0] == ms.Close(b, "heartbeat timeout")
    assert closes(acts) == [b]
    assert sorted(msgs(acts, m.Membership)) == [a, c]
    assert {(conn, x.seq) for conn, v in msgs(acts, m.CollectiveAbort).items() for x in v} == {
        (a, seq), (c, seq)}
    assert sorted(msgs(acts, m.MasterHeartbeat)) == [a, c]
    assert h.st.accepted() == [a, c]


def test_silent_unregistered_and_pending_connections_are_closed_too() -> None:
    h = Harness(heartbeat_timeout=1.0)
    (a,) = h.run(0)
    p, _ = h.join(0)
    u = h.connect()
    h.now = 2.0
    h.send(a, m.Heartbeat())
    acts = h.tick(2.5)
    assert sorted(closes(acts)) == [p, u]
    assert [x.conn for x in acts if isinstance(x, ms.Send)] == [a]
    assert h.st.pending() == []


# ---- protocol versions, malformed input, loopback mixing ---------------------------------------


def test_hello_of_another_version_is_rejected_and_closed() -> None:
    h = Harness()
    (a,) = h.run(0)
    b = h.connect()
    acts = h.hello(b, version=PV + 1)
    assert [type(x) for x in acts] == [ms.Send, ms.Close]
    assert acts[0].conn == acts[1].conn == b
    rej = acts[0].msg
    assert isinstance(rej, m.Rejected) and rej.version == PV and str(PV + 1) in rej.reason
    assert h.st.accepted() == [a] and h.st.pending() == []


def test_malformed_hello_of_another_version_is_rejected_not_kicked() -> None:
    h = Harness()
    (a,) = h.run(0)
    b = h.connect()
    body = msgspec.msgpack.encode([1, PV + 6, {"a": "new", "schema": [1, 2]}, b"\x00"])
    with pytest.raises(m.RemoteProtocolError):
        m.decode_peer_to_master(body)
    acts = h.malformed(b, "bad peer->master message", body)
    assert [type(x) for x in acts] == [ms.Send, ms.Close]
    assert isinstance(acts[0].msg, m.Rejected) and str(PV + 6) in acts[0].msg.reason
    assert acts[1].conn == b
    assert h.st.accepted() == [a]


@pytest.mark.parametrize("body", [
    b"",
    b"\xc1",
    msgspec.msgpack.encode([1, PV, "x"]),  # a Hello of our own version, but broken
    msgspec.msgpack.encode([99]),
    msgspec.msgpack.encode({"t": 1}),
])
def test_other_malformed_frames_kick_an_unregistered_connection(body: bytes) -> None:
    h = Harness()
    (a,) = h.run(0)
    b = h.connect()
    acts = h.malformed(b, "broken frame", body)
    assert_kicked(acts, b)
    assert acts[0].msg.reason == "broken frame"
    assert len(acts) == 2
    assert h.st.accepted() == [a]


@pytest.mark.parametrize("fields", [[1, PV, 0, 5000, "", 70000], [1, PV, 0, 5000, "", -1],
                                    [1, PV, 0, 70000], [1, PV, -1, 5000]],
                         ids=["state_port", "negative state_port", "p2p_port", "peer_group"])
def test_hello_with_a_field_out_of_range_is_kicked_at_decode_naming_the_field(
        fields: list[object]) -> None:
    """Regression: ``Hello.state_port`` 70000 was accepted and advertised to the group."""
    h = Harness()
    (a,) = h.run(0)
    b = h.connect()
    body = msgspec.msgpack.encode(fields)
    with pytest.raises(m.RemoteProtocolError) as info:
        m.decode_peer_to_master(body)
    assert "Hello." in str(info.value)
    acts = h.malformed(b, str(info.value), body)
    assert_kicked(acts, b)
    assert acts[0].msg.reason == str(info.value) and len(acts) == 2
    assert h.st.accepted() == [a] and h.st.pending() == []


def test_malformed_hello_of_another_version_from_a_registered_peer_is_a_kick() -> None:
    h = Harness()
    a, b = h.run(0, 0)
    acts = h.malformed(b, "bad", msgspec.msgpack.encode([1, PV + 1, 0]))
    assert_kicked(acts, b)
    assert [(x.conn, type(x.msg)) for x in acts[2:]] == [(a, m.Membership)]


def test_malformed_frame_of_an_accepted_peer_is_a_departure() -> None:
    h = Harness()
    a, b, c = h.run(0, 0, 0)
    seq = h.start([a, b, c], 1)
    acts = h.malformed(b, "frame too large")
    assert_kicked(acts, b)
    assert sorted(msgs(acts, m.Membership)) == [a, c]
    assert {(conn, x.seq) for conn, v in msgs(acts, m.CollectiveAbort).items() for x in v} == {
        (a, seq), (c, seq)}


@pytest.mark.parametrize("body", [
    b"\x91" * 100_000,  # deeply nested arrays: RecursionError
    b"\xa2\xff\xfe",  # a msgpack str that is not UTF-8: UnicodeDecodeError
], ids=["deep-nesting", "invalid-utf8"])
def test_malformed_body_never_raises_out_of_handle(body: bytes) -> None:
    h = Harness()
    h.run(0)
    b = h.connect()
    with pytest.raises(m.RemoteProtocolError):  # the transport does produce this Malformed
        m.decode_peer_to_master(body)
    acts = h.malformed(b, "bad", body)
    assert_kicked(acts, b)


@pytest.mark.parametrize(("first", "second", "ok"), [
    ("127.0.0.1", "10.0.0.2", False),
    ("10.0.0.2", "127.0.0.1", False),
    ("127.0.0.1", "localhost", True),
    ("::1", "127.0.0.5", True),
    ("localhost", "192.168.1.7", False),
    ("10.0.0.1", "10.0.0.2", True),
    ("10.0.0.1", "peer.example.org", True),
])
def test_loopback_and_non_loopback_peers_cannot_be_mixed(first: str, second: str, ok: bool) -> None:
    h = Harness()
    a, _ = h.join(0, host=first)
    b, acts = h.join(0, host=second)
    if ok:
        assert acts == [ms.Send(b, welcome(b, False))]
        assert h.st.pending() == [b]
    else:
        assert [type(x) for x in acts] == [ms.Send, ms.Close]
        assert isinstance(acts[0].msg, m.Rejected) and "loopback" in acts[0].msg.reason
        assert h.st.pending() == [] and h.st.accepted() == [a]


def test_loopback_mixing_considers_pending_peers_and_advertised_hosts() -> None:
    h = Harness()
    # else advertise_host is refused first
    h.st = ms.MasterState(allow_any_advertise_host=True, run_id=RUN)
    h.join(0, host="127.0.0.1")
    h.join(0, host="127.0.0.1")  # pending
    c, acts = h.join(0, host="127.0.0.1", advertise_host="203.0.113.5")
    assert isinstance(acts[0].msg, m.Rejected) and "loopback" in acts[0].msg.reason
    assert closes(acts) == [c]
    assert len(h.st.pending()) == 1


def test_rejected_peer_does_not_count_for_the_first_peer_rule() -> None:
    h = Harness()
    a = h.connect()
    assert isinstance(h.hello(a, version=PV + 1)[0].msg, m.Rejected)
    b, acts = h.join(0)
    assert sent_to(acts, b, m.Welcome) == [welcome(b, True)]


# ---- illegal votes ------------------------------------------------------------------------------


@dataclasses.dataclass
class World:
    h: Harness
    a: int  # accepted, group 0
    b: int  # accepted, group 0
    c: int  # accepted, group 0
    p: int  # pending, group 0
    u: int  # connected, no Hello


def _world() -> World:
    h = Harness()
    a, b, c = h.run(0, 0, 0)
    p, _ = h.join(0)
    h.send(p, m.Heartbeat())  # alive after its Hello: it counts as pending (limits.Admission)
    u = h.connect()
    return World(h, a, b, c, p, u)


def _illegal(w: World, case: str) -> tuple[int, list[ms.Action]]:
    """Set up ``case`` and send the illegal message; returns (offender, actions)."""
    h, a = w.h, w.a
    before_hello = {
        "topology before hello": m.VoteUpdateTopology(),
        "pending before hello": m.VotePeersPending(),
        "init before hello": m.CollectiveInit(1, 1, 1, 1),
        "done before hello": m.CollectiveDone(1, 1, True),
        "leave before hello": m.Leave(),
    }
    if case in before_hello:
        return w.u, h.send(w.u, before_hello[case])
    from_pending = {
        "topology from pending": m.VoteUpdateTopology(),
        "pending vote from pending": m.VotePeersPending(),
        "init from pending": m.CollectiveInit(1, 1, 1, 1),
        "done from pending": m.CollectiveDone(1, 1, True),
        "second hello from pending": m.Hello(PV, 0, 1234),
    }
    if case in from_pending:
        return w.p, h.send(w.p, from_pending[case])
    match case:
        case "second hello":
            return a, h.send(a, m.Hello(PV, 0, 1234))
        case "second hello of another version":
            return a, h.send(a, m.Hello(PV + 1, 0, 1234))
        case "hello port 0":
            return w.u, h.send(w.u, m.Hello(PV, 0, 0))
        case "hello port 65536":
            return w.u, h.send(w.u, m.Hello(PV, 0, 65536))
        case "hello negative group":
            return w.u, h.send(w.u, m.Hello(PV, -1, 5000))
        case "hello group 2**32":
            return w.u, h.send(w.u, m.Hello(PV, 2**32, 5000))
        case "hello state port 70000":
            return w.u, h.send(w.u, m.Hello(PV, 0, 5000, "", 70000))
        case "hello negative state port":
            return w.u, h.send(w.u, m.Hello(PV, 0, 5000, "", -1))
        case "duplicate topology vote":
            h.send(w.b, m.VoteUpdateTopology())  # another voter's vote must survive the kick
            assert h.send(a, m.VoteUpdateTopology()) == []
            return a, h.send(a, m.VoteUpdateTopology())
        case "duplicate pending vote":
            h.send(w.b, m.VotePeersPending())
            assert h.send(a, m.VotePeersPending()) == []
            return a, h.send(a, m.VotePeersPending())
        case "topology vote while collective runs":
            h.start([a, w.b, w.c], 1)
            return a, h.send(a, m.VoteUpdateTopology())
        case "topology vote while collective votes":
            h.send(a, m.CollectiveInit(1, 1, 1, 1))
            return a, h.send(a, m.VoteUpdateTopology())
        case "init while voting topology":
            h.send(a, m.VoteUpdateTopology())
            return a, h.send(a, m.CollectiveInit(1, 1, 1, 1))
        case "init of a running tag":
            h.start([a, w.b, w.c], 1)
            return a, h.send(a, m.CollectiveInit(1, 1, 1, 1))
        case "init of a voting tag":
            h.send(a, m.CollectiveInit(1, 1, 1, 1))
            return a, h.send(a, m.CollectiveInit(1, 1, 1, 1))
    raise AssertionError(case)


ILLEGAL = [
    "topology before hello", "pending before hello", "init before hello", "done before hello",
    "leave before hello", "topology from pending", "pending vote from pending",
    "init from pending", "done from pending", "second hello from pending", "second hello",
    "second hello of another version", "hello port 0", "hello port 65536",
    "hello negative group", "hello group 2**32", "hello state port 70000",
    "hello negative state port", "duplicate topology vote",
    "duplicate pending vote", "topology vote while collective runs",
    "topology vote while collective votes", "init while voting topology",
    "init of a running tag", "init of a voting tag",
]


@pytest.mark.parametrize("case", ILLEGAL)
def test_illegal_message_kicks_only_the_offender(case: str) -> None:
    w = _world()
    h = w.h
    offender, acts = _illegal(w, case)
    assert_kicked(acts, offender)
    survivors = [x for x in (w.a, w.b, w.c) if x != offender]
    accepted_offender = offender in (w.a, w.b, w.c)
    rest = acts[2:]
    if accepted_offender:
        # a departure: fresh membership first, then the aborts of its running collectives
        assert sorted(msgs(rest, m.Membership)) == survivors
        aborts = msgs(rest, m.CollectiveAbort)
        if case in ("topology vote while collective runs", "init of a running tag"):
            assert sorted(aborts) == survivors
            assert all(x.tag == 1 and x.seq > 0 for (x,) in aborts.values())
        else:
            assert aborts == {}
        assert [x for x in rest if not isinstance(x.msg, m.Membership | m.CollectiveAbort)] == []
    else:
        assert rest == []
    assert offender not in h.st.accepted() + h.st.pending()
    assert h.st.accepted() == survivors
    # the others are unaffected: their votes (also those cast before the kick) still count
    assert (w.p in h.st.pending()) == (offender != w.p)
    members = sorted(survivors + ([w.p] if offender != w.p else []))

    def pending_round(already: set[int]) -> None:
        voters, waiting = h.st.accepted(), bool(h.st.pending())
        acts = []
        for s in voters:
            if s not in already:
                acts += h.send(s, m.VotePeersPending())
        assert msgs(acts, m.PeersPendingAnswer) == {
            s: [m.PeersPendingAnswer(waiting)] for s in voters}

    def topology_round(already: set[int]) -> None:
        voters = h.st.accepted()
        acts = []
        for s in voters:
            if s not in already:
                acts += h.send(s, m.VoteUpdateTopology())
        assert sorted(msgs(acts, m.TopologyUpdated)) == voters
        assert h.st.accepted() == members

    if case == "duplicate topology vote":  # b's topology vote is still in
        topology_round({w.b})
        pending_round(set())
    else:  # b's pending vote may still be in: it conflicts with a topology vote, finish it first
        pending_round({w.b} if case == "duplicate pending vote" else set())
        topology_round(set())
    seq = h.start(sorted(members), 42)
    acts = []
    for s in sorted(members):
        acts += h.send(s, m.CollectiveDone(42, seq, True))
    assert sorted(msgs(acts, m.CollectiveComplete)) == sorted(members)
