"""The harness of the sans-IO master's tests (``test_master_*.py``); no tests here.

``Harness`` wraps a ``MasterState``, feeds it events and checks, for every batch of actions,
that the master never sends to a connection it already closed (or that already
disconnected). The helpers pick messages out of action lists; ``departure`` makes a peer leave
in one of the five ways a peer can (``DEPARTURES``); ``sync_vote`` builds shared-state votes.
"""

from __future__ import annotations

import itertools

import msgspec

from pccl_aio._master.core import state as ms
from pccl_aio._types import DataType, SyncStrategy
from pccl_aio._wire import messages as m

PV = m.PROTOCOL_VERSION
RUN = "test-run"  # the run id of every harness's master (else a random one)


def welcome(conn: int, accepted: bool) -> m.Welcome:
    """The ``Welcome`` a harness's master sends ``conn`` (its run is term 1)."""
    return m.Welcome(conn, accepted, term=1, run_id=RUN)
TERMINAL = (m.CollectiveComplete, m.CollectiveAbort, m.CollectiveRejected)
#: Joint-vote answers carry the run's round number, which only failover uses (a rejoining
#: peer reports the last it saw; ``test_master_failover.py`` checks them): the other tests
#: see them with round 0, as they were written.
ROUNDED = (m.PeersPendingAnswer, m.TopologyUpdated)
#: ``PeersWaiting`` tells the members when joiners become due (``wait_for_peers``); only the
#: tests of that notice see them (``Harness.notices``), the others as they were written.
NOTICE = m.PeersWaiting


class Harness:
    """Wraps a MasterState; assigns connection ids 1, 2, 3, ... and checks send-after-close."""

    def __init__(self, heartbeat_timeout: float = 5.0) -> None:
        self.st = ms.MasterState(heartbeat_timeout=heartbeat_timeout, run_id=RUN,
                                 recovery_grace=heartbeat_timeout)  # (the default: twice)
        self.now = 0.0
        self._ids = itertools.count(1)
        self.closed: set[int] = set()
        self.rounds = False  # keep the answers' round numbers (the failover tests do)
        self.notices = False  # keep the PeersWaiting notices (their own tests do)

    def handle(self, event: ms.Event) -> list[ms.Action]:
        actions = self.st.handle(event)
        assert isinstance(actions, list)
        if not self.rounds:  # joint-vote answers as before their round numbers (see ROUNDED)
            actions = [ms.Send(a.conn, msgspec.structs.replace(a.msg, round=0))
                       if isinstance(a, ms.Send) and isinstance(a.msg, ROUNDED) else a
                       for a in actions]
        if not self.notices:
            actions = [a for a in actions
                       if not (isinstance(a, ms.Send) and isinstance(a.msg, NOTICE))]
        for a in actions:
            assert isinstance(a, ms.Send | ms.Close), a
            if isinstance(a, ms.Send):
                assert a.conn not in self.closed, f"send after close: {a}"
            else:
                self.closed.add(a.conn)
        return actions

    def connect(self, host: str = "127.0.0.1") -> int:
        conn = next(self._ids)
        assert self.handle(ms.Connected(conn, host, self.now)) == []
        return conn

    def hello(self, conn: int, group: int = 0, port: int | None = None, *,
              version: int = PV, advertise_host: str = "", state_port: int = 0) -> list[ms.Action]:
        port = 40000 + conn if port is None else port
        return self.send(conn, m.Hello(version, group, port, advertise_host, state_port))

    def join(self, group: int = 0, host: str = "127.0.0.1",
             advertise_host: str = "", state_port: int = 0) -> tuple[int, list[ms.Action]]:
        conn = self.connect(host)
        return conn, self.hello(conn, group, advertise_host=advertise_host, state_port=state_port)

    def send(self, conn: int, msg: m.PeerToMaster) -> list[ms.Action]:
        return self.handle(ms.Received(conn, msg, self.now))

    def disconnect(self, conn: int) -> list[ms.Action]:
        out = self.handle(ms.Disconnected(conn, self.now))
        self.closed.add(conn)
        return out

    def malformed(self, conn: int, reason: str = "garbage", body: bytes = b"") -> list[ms.Action]:
        return self.handle(ms.Malformed(conn, reason, self.now, body))

    def tick(self, now: float) -> list[ms.Action]:
        self.now = now
        return self.handle(ms.Tick(now))

    def vote_topology_all(self) -> list[ms.Action]:
        out: list[ms.Action] = []
        for c in self.st.accepted():
            out += self.send(c, m.VoteUpdateTopology())
        return out

    def run(self, *groups: int) -> list[int]:
        """Peers in ``groups`` (one entry per peer), all accepted; returns their ids."""
        conns = []
        for g in groups:
            conn, _ = self.join(g)
            conns.append(conn)
        if len(conns) > 1:
            self.vote_topology_all()
        assert self.st.accepted() == sorted(conns)
        assert self.st.pending() == []
        return conns

    def init(self, conns: list[int], tag: int, count: int = 8, dtype: int = 10, op: int = 0,
             **kw: int) -> list[ms.Action]:
        out: list[ms.Action] = []
        for c in conns:
            out += self.send(c, m.CollectiveInit(tag, count, dtype, op, **kw))
        return out

    def start(self, conns: list[int], tag: int) -> int:
        """All ``conns`` init ``tag``; returns the seq of the CollectiveStart they all got."""
        acts = self.init(conns, tag)
        starts = msgs(acts, m.CollectiveStart)
        assert sorted(starts) == sorted(conns), acts
        seqs = {s.seq for (s,) in starts.values()}
        assert len(seqs) == 1
        return seqs.pop()


def digest(content: int) -> bytes:
    """A fake xxh3-128 digest of shared-state bytes numbered ``content``."""
    return bytes([content]) * 16


def sync_vote(revision: int = 0, content: int = 1, *, nbytes: int = 64,
              strategy: SyncStrategy = SyncStrategy.ENFORCE_POPULAR,
              fresh: bool = False) -> m.VoteSync:
    """A shared-state vote on one entry ``"w"`` (``nbytes`` bytes of ``content``)."""
    entry = m.SyncEntry("w", int(DataType.UINT8), nbytes, digest(content))
    return m.VoteSync(revision, int(strategy), [entry], fresh)


def sent_to(actions: list[ms.Action], conn: int, type_: type | None = None) -> list[object]:
    """Messages sent to ``conn`` (of ``type_``), in order."""
    return [a.msg for a in actions if isinstance(a, ms.Send) and a.conn == conn
            and (type_ is None or isinstance(a.msg, type_))]


def msgs(actions: list[ms.Action], type_: type) -> dict[int, list[object]]:
    """conn -> messages of ``type_`` sent to it."""
    out: dict[int, list[object]] = {}
    for a in actions:
        if isinstance(a, ms.Send) and isinstance(a.msg, type_):
            out.setdefault(a.conn, []).append(a.msg)
    return out


def closes(actions: list[ms.Action]) -> list[int]:
    return [a.conn for a in actions if isinstance(a, ms.Close)]


def index_of(actions: list[ms.Action], conn: int, type_: type) -> int:
    for i, a in enumerate(actions):
        if isinstance(a, ms.Send) and a.conn == conn and isinstance(a.msg, type_):
            return i
    raise AssertionError(f"no {type_.__name__} to {conn} in {actions}")


def assert_kicked(actions: list[ms.Action], conn: int) -> None:
    """``conn`` got Kicked then Close, first thing; nothing else is addressed to it."""
    assert len(actions) >= 2, actions
    first, second = actions[0], actions[1]
    assert isinstance(first, ms.Send) and first.conn == conn and isinstance(first.msg, m.Kicked)
    assert first.msg.reason
    assert isinstance(second, ms.Close) and second.conn == conn
    assert [a for a in actions[2:] if a.conn == conn] == []


def ring_ids(msg: m.Membership) -> list[int]:
    return [p.peer_id for p in msg.ring]


# ---- deadlock: the rule, written the naive way (an oracle independent of ``deadlock.find``) ------

Item = tuple[str, int, int]  # ("topology" | "pending", 0, 0), ("sync" | "optimize", group, 0),
#                              ("collective", group, tag)


def stuck_peers(members: dict[int, int], waits: dict[int, set[Item]],
                voters: dict[Item, set[int]]) -> set[int]:
    """Accepted peers (``members``: peer -> group) that wait forever: start from every peer that
    waits on something; drop one if an item it waits on misses nobody, or misses a peer outside
    the set that can cast it (not one whose unstarted launch misses a peer of the set, for a
    topology or sync vote); repeat. ``voters``: who cast each item (launched, for collectives)."""

    def missing(item: Item) -> set[int]:
        scope = {c for c, g in members.items()
                 if item[0] in ("topology", "pending") or g == item[1]}
        return scope - voters.get(item, set())

    stuck = {c for c, items in waits.items() if items and c in members}
    while True:
        held = {c for c in members if c not in stuck and any(
            c in v and missing(x) & stuck for x, v in voters.items() if x[0] == "collective")}
        free = {c for c in stuck if any(
            not missing(i) or any(
                x not in stuck and not (i[0] in ("topology", "sync", "optimize") and x in held)
                for x in missing(i)) for i in waits[c])}
        if not free:
            return stuck
        stuck -= free


# ---- departures ---------------------------------------------------------------------------------


def departure(h: Harness, how: str, conn: int) -> list[ms.Action]:
    if how == "disconnect":
        return h.disconnect(conn)
    if how == "leave":
        acts = h.send(conn, m.Leave())
        assert acts[0] == ms.Close(conn, acts[0].reason)
        return acts[1:]
    if how == "kicked":
        acts = h.send(conn, m.Hello(PV, 0, 1))  # second Hello
        assert_kicked(acts, conn)
        return acts[2:]
    if how == "malformed":
        acts = h.malformed(conn)
        assert_kicked(acts, conn)
        return acts[2:]
    if how == "heartbeat":
        # everyone else speaks now; ``conn`` has been silent since t=-10 (``run_with_silent``)
        for c in h.st.accepted() + h.st.pending():
            if c != conn:
                h.send(c, m.Heartbeat())
        acts = h.tick(h.now + 0.8 * h.st.heartbeat_timeout)
        assert acts[0] == ms.Close(conn, "heartbeat timeout")
        assert closes(acts) == [conn]
        return [a for a in acts[1:] if not isinstance(a.msg, m.MasterHeartbeat)]
    raise AssertionError(how)


DEPARTURES = ["disconnect", "leave", "kicked", "malformed", "heartbeat"]


def run_with_silent(h: Harness, groups: tuple[int, ...], silent_idx: int) -> list[int]:
    """Like ``h.run``, but the peer at ``silent_idx`` speaks at t=-10 and the others at t=0.

    The silent peer must not send anything later, so that the "heartbeat" departure (a Tick
    at t=4 with a 5 s timeout) kills it and nobody else.
    """
    conns = []
    for i, g in enumerate(groups):
        h.now = -10.0 if i == silent_idx else 0.0
        conns.append(h.join(g)[0])
    h.now = -10.0 if silent_idx == 0 else 0.0
    h.send(conns[0], m.VoteUpdateTopology())  # the first peer alone admits the others
    h.now = 0.0
    assert h.st.accepted() == sorted(conns)
    return conns

