"""Seeded fuzz of the sans-IO master: ``MasterState.handle()`` never raises, its state stays
consistent, and no peer is ever left deadlocked.

    python tests/stress/fuzz_master.py --events 10000000 --seed 7

Events: connects, hellos, topology and pending votes, launches (``CollectiveInit``), waits,
dones (right and stale seqs), withdrawals, sync votes and dones, leaves, heartbeats, malformed
frames, disconnects (also of closed and unknown connections) and ticks that time peers out.
Messages are built as structs, past decoding, with random and hostile fields (ports, groups,
tags, codes, hashes and revisions out of range, duplicate keys); groups of peers also act in
concert, so that collectives and syncs start and complete. After every event: the actions are
``Send``/``Close`` and nothing goes to a closed connection; seqs increase and epochs never go
back; every ``Membership`` is valid on the wire; the bookkeeping is consistent; no set of peers
is left deadlocked. Needs only the package (no pytest); exit status 1 on the first failure,
with the seed and the last events.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import itertools
import random
import sys
import time
import traceback

import msgspec

from pccl_aio._errors import RemoteProtocolError
from pccl_aio._master.core import deadlock
from pccl_aio._master.core import state as ms
from pccl_aio._master.core.records import Peer
from pccl_aio._wire import messages as m

PV = m.PROTOCOL_VERSION
HOSTILE_INTS = (-1, -(2**63), 2**32, 2**64, 2**64 + 5, 2**80, 70000, 99)
HOSTS = ("127.0.0.1",) * 30 + ("::1", "localhost", "10.0.0.7")
ADVERTISED = ("", "", "", "127.0.0.2", "10.1.1.1", "\x00", "h" * 300)
BODIES = (b"", b"\xc1", m.encode(m.Hello(PV + 1, 0, 5000)), b"\x91" * 64, b"\x92\x01")
TAGS = (0, 1, 2, 3)
STRAY = 10**9  # a connection id the transport never hands out


@dataclasses.dataclass
class Stats:
    events: int = 0
    seconds: float = 0.0
    sent: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0


class FuzzFailure(AssertionError):
    """An invariant broke, or ``handle`` raised; the message names the seed and the event."""


class Fuzzer:
    def __init__(self, seed: int, max_conns: int = 6) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.st = ms.MasterState(heartbeat_timeout=5.0)
        self.max_conns = max_conns
        self.now = 0.0
        self.next_conn = 1
        self.live: list[int] = []  # connected, not closed
        self.closed: list[int] = []  # closed by the master, Disconnected not reported yet
        self.gone: set[int] = set()  # closed or disconnected: nothing may be sent to them
        self.last_seq = 0
        self.tickets: set[int] = set()  # handed out (CollectiveComplete.next_seq), not started
        self.last_epoch = 0
        self.stats = Stats()
        self.recent: collections.deque[object] = collections.deque(maxlen=12)
        self.kinds, weights = zip(*[
            ("connect", 3), ("hello", 5), ("topology", 6), ("pending", 5), ("group topology", 3),
            ("init", 10), ("group init", 10), ("wait", 8), ("done", 24), ("sync", 4),
            ("group sync", 4), ("sync done", 8), ("withdraw", 3), ("leave", 0.5),
            ("heartbeat", 4), ("malformed", 0.5), ("disconnect", 1), ("tick", 4), ("stray", 1),
            ("hostile", 2)])
        self.cum = list(itertools.accumulate(weights))

    # ---- driving ------------------------------------------------------------------------------
    def run(self, events: int) -> Stats:
        """Drive at least ``events`` events (``handle`` calls) from where the last run stopped."""
        start = time.perf_counter()
        kinds, cum, choices = self.kinds, self.cum, self.rng.choices
        target = self.stats.events + events
        while self.stats.events < target:
            for kind in choices(kinds, cum_weights=cum, k=256):
                if self.stats.events >= target:
                    break
                try:
                    self.step(kind)
                except FuzzFailure:
                    raise
                except AssertionError as exc:  # an invariant
                    raise FuzzFailure(self.report(str(exc))) from exc
        self.stats.seconds += time.perf_counter() - start
        return self.stats

    def report(self, what: str) -> str:
        last = "\n".join(f"  {e!r}" for e in self.recent)
        return f"seed {self.seed}, event {self.stats.events}: {what}\nlast events:\n{last}"

    def event(self, ev: ms.Event) -> list[ms.Action]:
        self.recent.append(ev)
        self.stats.events += 1
        try:
            acts = self.st.handle(ev)
        except Exception as exc:
            raise FuzzFailure(self.report(f"handle() raised {exc!r}\n"
                                          f"{traceback.format_exc()}")) from exc
        self.check(acts)
        if isinstance(ev, ms.Disconnected):
            self.drop(ev.conn)
        return acts

    def send(self, conn: int, msg: m.PeerToMaster) -> None:
        self.event(ms.Received(conn, msg, self.now))

    def drop(self, conn: int) -> None:
        if conn in self.live:
            self.live.remove(conn)
        self.gone.add(conn)

    def pick(self) -> int | None:
        """A live connection, mostly a registered one (anything else before Hello is a kick)."""
        if not self.live:
            return None
        conn = self.rng.choice(self.live)
        if not self.peer(conn).registered and self.rng.random() < 0.97:
            conn = self.rng.choice(self.live)
        return conn

    def accepted(self) -> list[int]:
        return self.st.accepted()

    def peer(self, conn: int) -> Peer:
        """The master's record of connection ``conn`` (KeyError if it has none)."""
        p = self.st.access.peer(conn)
        if p is None:
            raise KeyError(conn)
        return p

    def step(self, kind: str) -> None:
        r = self.rng
        if kind == "connect":
            if len(self.live) < self.max_conns:
                conn = self.next_conn
                self.next_conn += 1
                self.live.append(conn)
                self.event(ms.Connected(conn, r.choice(HOSTS), self.now))
        elif kind == "hello":
            fresh = [c for c in self.live if not self.peer(c).registered]
            conn = r.choice(fresh) if fresh else self.pick() if r.random() < 0.05 else None
            if conn is not None:
                self.send(conn, m.Hello(PV if r.random() < 0.95 else PV + 1,
                                        r.choice((0, 0, 1)), 40000 + conn % 1000, "",
                                        r.choice((0, 0, 41000 + conn % 1000))))
        elif kind in ("topology", "pending"):
            acc = self.accepted()
            idle = [c for c in acc if not self.peer(c).tags and not (
                self.peer(c).voted_topology if kind == "topology"
                else self.peer(c).voted_pending)]
            if acc:
                msg = m.VoteUpdateTopology() if kind == "topology" else m.VotePeersPending()
                self.send(r.choice(idle if idle and r.random() < 0.95 else acc), msg)
        elif kind == "group topology":
            for conn in self.accepted():
                p = self.st.access.peer(conn)  # (an earlier vote may have kicked it)
                if p is not None and not p.tags:
                    self.send(conn, m.VoteUpdateTopology())
        elif kind == "init":
            acc = self.accepted()
            if acc:
                conn, tag = r.choice(acc), r.choice(TAGS)
                p = self.peer(conn)
                if (tag in p.tags or p.voted_topology) and r.random() < 0.95:
                    return  # mostly legal launches: an illegal one is a kick
                self.send(conn, m.CollectiveInit(tag, 8, 10, 0)
                          if r.random() < 0.9 else self.init_msg(tag))
        elif kind == "group init":
            acc = self.accepted()
            if acc:
                group, tag = self.peer(r.choice(acc)).group, r.choice(TAGS)
                wait = r.random() < 0.5
                init = m.CollectiveInit(tag, 8, 10, 0)
                for conn in self.st.accepted(group):
                    p = self.st.access.peer(conn)
                    if p is not None and tag not in p.tags and not p.voted_topology:
                        self.send(conn, init if r.random() < 0.95 else self.corrupt(init))
                        if wait and self.st.access.peer(conn) is not None:
                            self.send(conn, m.CollectiveWait(tag))
        elif kind == "wait":
            acc = self.accepted()
            if acc:
                conn = r.choice(acc)
                tags = sorted(self.peer(conn).tags) or [r.choice(TAGS)]
                self.send(conn, m.CollectiveWait(r.choice(tags)))
        elif kind == "done":
            self.done()
        elif kind == "sync":
            acc = self.accepted()
            if acc:
                conn = r.choice(acc)
                p = self.peer(conn)
                busy = p.tags or p.voted_topology or self.st.access.sync_busy(conn)
                if busy and r.random() < 0.9:
                    return
                self.send(conn, self.sync_msg(r.random() < 0.1, p.group))
        elif kind == "group sync":
            acc = self.accepted()
            if acc:
                group = self.peer(r.choice(acc)).group
                vote = self.sync_msg(False, group)
                for conn in self.st.accepted(group):
                    p = self.st.access.peer(conn)
                    if (p is not None and not p.tags and not p.voted_topology
                            and not self.st.access.sync_busy(conn)):
                        x = r.random()
                        self.send(conn, vote if x < 0.8 else self.sync_msg(False, group)
                                  if x < 0.9 else self.corrupt(vote))
        elif kind == "sync done":
            syncing = self.st.access.syncing()
            acc = syncing if syncing or r.random() < 0.05 else []
            if acc:
                self.send(r.choice(acc), m.SyncDone(r.random() < 0.9, "x"))
        elif kind == "withdraw":
            conn = self.pick()
            if conn is not None:
                kind_ = r.choice(("topology", "pending", "topology", "sync", ""))
                self.send(conn, m.WithdrawVote(kind_))  # type: ignore[arg-type]
        elif kind == "leave":
            conn = self.pick()
            if conn is not None:
                self.send(conn, m.Leave())
        elif kind == "heartbeat":
            for conn in list(self.live):
                if r.random() < 0.7:
                    self.send(conn, m.Heartbeat())
        elif kind == "malformed":
            conn = self.pick()
            if conn is not None:
                self.event(ms.Malformed(conn, "garbage", self.now, r.choice(BODIES)))
        elif kind == "disconnect":
            pool = self.closed if self.closed and r.random() < 0.5 else self.live
            if pool:
                conn = pool.pop(r.randrange(len(pool)))
                if conn in self.live:
                    self.live.remove(conn)
                self.event(ms.Disconnected(conn, self.now))
        elif kind == "tick":
            self.now += r.choice((0.1, 0.1, 0.5, 1.0, 2.0, 6.0)) if r.random() < 0.3 else 0.0
            self.event(ms.Tick(self.now))
        elif kind == "stray":  # events for connections that never were, or are gone
            conn = r.choice((STRAY, *self.gone)) if self.gone else STRAY  # never a live id
            self.send(conn, m.VoteUpdateTopology())
            self.event(ms.Disconnected(conn, self.now))
        elif kind == "hostile":
            conn = self.pick()
            if conn is not None:
                self.send(conn, self.hostile_msg())

    def done(self) -> None:
        r = self.rng
        acc = self.accepted()
        if not acc:
            return
        conn = r.choice(acc)
        p = self.peer(conn)
        running = self.st.running(p.group)
        tags = [t for t in running if t in p.tags]
        if tags and r.random() < 0.85:
            tag = r.choice(tags)
            self.send(conn, m.CollectiveDone(tag, running[tag], r.random() < 0.92, "x"))
        else:  # stale, withdrawn (seq 0) or foreign
            self.send(conn, m.CollectiveDone(r.choice(TAGS), r.choice((0, self.last_seq,
                                                                       self.last_seq + 1)),
                                             r.random() < 0.5, "stale"))

    # ---- messages -----------------------------------------------------------------------------
    def hostile_int(self) -> int:
        return self.rng.choice(HOSTILE_INTS)

    def init_msg(self, tag: int) -> m.CollectiveInit:
        r = self.rng
        h = self.hostile_int
        return m.CollectiveInit(tag if r.random() < 0.7 else h(),
                                r.choice((8, 9, 0, -1, 2**64)), r.choice((10, 9, 12, -1, 99)),
                                r.choice((0, 1, 5, -1)), r.choice((0, 1, 3, -1)),
                                r.choice((0, 2, 1, 99)))

    def sync_msg(self, hostile: bool, group: int = 0) -> m.VoteSync:
        r = self.rng
        if not hostile:  # mostly the group's revision or the next one, so that syncs run
            content = r.choice((1, 1, 2))
            entries = [m.SyncEntry("w", 0, 64, bytes([content]) * 16),
                       m.SyncEntry("m", 10, 8, b"", True)][: r.choice((1, 2, 2))]
            last = self.st.access.revisions().get(group, 0)
            return m.VoteSync(max(0, last + r.choice((0, 0, 1, 1, 2, -1))),
                              r.choice((0,) * 8 + (1, 2)), entries, r.random() < 0.3)
        h = self.hostile_int
        entries = [m.SyncEntry(r.choice(("w", "w", "", "\x00")), r.choice((0, 12, -1)),
                               r.choice((64, -1, 2**64)), r.choice((b"", b"\x01" * 16, b"\x02",
                                                                    b"\x03" * 40)),
                               r.random() < 0.3) for _ in range(r.choice((0, 1, 2, 3)))]
        return m.VoteSync(r.choice((0, 1, -1, 2**64, h())), r.choice((0, 1, 2, 3, -1, 99)),
                          entries, r.random() < 0.5)

    def corrupt(self, msg: m.PeerToMaster) -> m.PeerToMaster:
        """``msg`` with one field (or one field of one entry) out of its range."""
        r = self.rng
        fields = [f for f in msg.__struct_fields__ if not isinstance(getattr(msg, f), bool)]
        name = r.choice(fields)
        value = getattr(msg, name)
        if isinstance(value, list):
            if not value:
                return msg
            i = r.randrange(len(value))
            entry = value[i]
            sub = r.choice([f for f in entry.__struct_fields__ if f != "allow_inequality"])
            bad = self.hostile_value(getattr(entry, sub))
            value = [*value[:i], msgspec.structs.replace(entry, **{sub: bad}), *value[i + 1:]]
        else:
            value = self.hostile_value(value)
        return msgspec.structs.replace(msg, **{name: value})

    def hostile_value(self, value: object) -> object:
        r = self.rng
        if isinstance(value, int):
            return r.choice((*HOSTILE_INTS, 3, 12, 5))
        if isinstance(value, bytes):
            return r.choice((b"", b"\x01", b"\x09" * 15, b"\x07" * 17, b"\x05" * 16))
        return r.choice(("", "\x00", "w", "m", "x" * 5000))

    def hostile_msg(self) -> m.PeerToMaster:
        r = self.rng
        h = self.hostile_int
        match r.randrange(7):
            case 0:
                return m.Hello(r.choice((PV, PV, -1, 2**40)), r.choice((0, 1, h())),
                               r.choice((5000, 0, h())), r.choice(ADVERTISED),
                               r.choice((0, 5001, h())))
            case 1:
                return self.init_msg(h())
            case 2:
                return m.CollectiveWait(h())
            case 3:
                return m.CollectiveDone(h(), h(), r.random() < 0.5, "\udcff" * 3)
            case 4:
                return self.sync_msg(hostile=True)
            case 5:
                return m.SyncDone(r.random() < 0.5, "")
            case _:
                return m.CollectiveInit(r.choice(TAGS), 8, 10, 0, r.choice((1, 2, 3)),
                                        r.choice((0, 1, 2, 12)))

    # ---- invariants ---------------------------------------------------------------------------
    def check(self, acts: list[ms.Action]) -> None:
        if type(acts) is not list:
            raise AssertionError(f"handle() returned {acts!r}")
        starts: dict[int, int] = {}
        sent = self.stats.sent
        for a in acts:
            if type(a) is ms.Send:
                if a.conn in self.gone or a.conn >= self.next_conn:
                    raise AssertionError(f"send to a closed or unknown connection: {a}")
                msg = a.msg
                name = type(msg).__name__
                sent[name] += 1
                if name == "Membership":
                    self.check_membership(msg)  # type: ignore[arg-type]
                elif name == "CollectiveStart":
                    # A seq starts once: a fresh one, or a ticket handed out with a verdict.
                    seq = msg.seq  # type: ignore[union-attr]
                    if seq not in starts:
                        if seq <= self.last_seq and seq not in self.tickets:
                            raise AssertionError(f"seq {seq} after {self.last_seq}")
                        self.tickets.discard(seq)
                        starts[seq] = seq
                        self.last_seq = max(self.last_seq, seq)
                elif name == "CollectiveComplete" and msg.next_seq:  # type: ignore[union-attr]
                    nxt = msg.next_seq  # type: ignore[union-attr]
                    if nxt <= self.last_seq and nxt not in self.tickets:
                        raise AssertionError(f"ticket {nxt} after seq {self.last_seq}")
                    self.tickets.add(nxt)
                    self.last_seq = max(self.last_seq, nxt)
                elif getattr(msg, "deadlock", False):
                    sent["deadlock verdicts"] += 1
            elif type(a) is ms.Close:
                sent["Close"] += 1
                if a.conn in self.live:
                    self.live.remove(a.conn)
                    self.closed.append(a.conn)
                self.gone.add(a.conn)
            else:
                raise AssertionError(f"not an action: {a!r}")
        self.check_state()

    def check_membership(self, msg: m.Membership) -> None:
        if msg.epoch < self.last_epoch:
            raise AssertionError(f"epoch {msg.epoch} after {self.last_epoch}")
        self.last_epoch = msg.epoch
        try:  # ports and ids valid on the wire
            same = m.decode_master_to_peer(m.encode(msg)) == msg
        except (RemoteProtocolError, OverflowError) as exc:
            raise AssertionError(f"{msg} is not valid on the wire: {exc}") from exc
        if not same:
            raise AssertionError(f"{msg} does not survive the wire")

    def check_state(self) -> None:
        st = self.st
        peers = {p.conn: p for p in st.access.peers()}
        for conn, p in peers.items():
            if (p.voted_topology or p.voted_pending or p.tags) and not p.accepted:
                raise AssertionError(f"peer {conn} votes but is not accepted: {p}")
            if p.accepted and not p.registered:
                raise AssertionError(f"peer {conn} accepted before its Hello")
        for (group, tag), op in st.access.collectives().items():
            who = op.participants if op.seq else tuple(op.descs)
            if not who or op.waits - set(op.descs):
                raise AssertionError(f"op ({group}, {tag}) is inconsistent: {op}")
            for conn in who:
                p = peers.get(conn)
                if p is None or not p.accepted or p.group != group or tag not in p.tags:
                    raise AssertionError(f"op ({group}, {tag}) names peer {conn}: {op}, {p}")
        for conn in st.access.sync_voters():
            if conn not in peers or not peers[conn].accepted:
                raise AssertionError(f"sync vote of peer {conn}, not accepted")
        if deadlock.find(st.access) is not None:
            raise AssertionError(f"left deadlocked: {deadlock.find(st.access)}")


def fuzz(events: int, seed: int, max_conns: int = 6) -> Stats:
    """Drive ``events`` events of seed ``seed``; raises FuzzFailure on the first failure."""
    return Fuzzer(seed, max_conns).run(events)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description="Seeded fuzz of the pccl_aio master's MasterState.handle().",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--events", type=int, default=1_000_000,
                   help="events to drive (MasterState.handle calls)")
    p.add_argument("--seed", type=int, default=0, help="random seed (runs are reproducible)")
    p.add_argument("--max-conns", type=int, default=6, help="connections open at once")
    args = p.parse_args(argv)
    try:
        stats = fuzz(args.events, args.seed, args.max_conns)
    except FuzzFailure as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        return 1
    top = ", ".join(f"{k} {v}" for k, v in stats.sent.most_common())
    print(f"{stats.events} events in {stats.seconds:.1f} s ({stats.rate:,.0f} events/s), "
          f"seed {args.seed}; sent: {top}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
