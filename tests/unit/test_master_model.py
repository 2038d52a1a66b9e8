"""The sans-IO master against a client-side model, randomized (seeded and hypothesis).

Every action batch is checked: one terminal message per collective init, increasing seqs,
fresh membership before aborts, no kick of a legal message, no send after close; a withdrawn
vote gets no answer and a withdrawal no reply but deadlock verdicts it reveals; a group's
sync starts exactly when every member voted (with the plans and kicks its election decides),
and every participant that stays gets exactly one ``SyncComplete`` per plan, only after all
reported ``SyncDone``. And
``handle`` never raises, also on arbitrary event sequences. Deadlocks: after every batch no
set of accepted peers is left deadlocked (``master_harness.stuck_peers``), and the calls the
rule fails each get exactly one answer, all with one reason (the incremental rule,
``quiet.py``, decides when the full one runs: a deadlock it lets pass fails here).
Harness: ``master_harness``.
"""

from __future__ import annotations

import dataclasses
import random
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pccl_aio._master.core import state as ms
from pccl_aio._master.core.election import Election, elect
from pccl_aio._types import SyncStrategy
from pccl_aio._wire import messages as m
from tests.unit.master_harness import PV, Harness, Item, ring_ids, stuck_peers, sync_vote

# ---- randomized invariant: one terminal message per init, increasing seqs, never raises --------


@dataclasses.dataclass
class _P:
    group: int
    registered: bool = False
    accepted: bool = False
    epoch: int = 0
    voted_topology: bool = False
    voted_pending: bool = False
    outstanding: dict[int, int] = dataclasses.field(default_factory=dict)  # tag -> seq (0: voting)
    launched_in: dict[int, int] = dataclasses.field(default_factory=dict)  # ranked tag -> epoch
    awaited: set[int] = dataclasses.field(default_factory=set)  # voting tags it sent a Wait for
    done_sent: set[int] = dataclasses.field(default_factory=set)
    revision: int = 0  # of its shared state
    fresh: bool = True  # never synced
    sync_vote: m.VoteSync | None = None  # counted by the master
    plan: m.SyncPlan | None = None  # its running sync: no SyncComplete yet
    sync_done: bool | None = None  # the ok of its SyncDone for ``plan``; None: not sent

    def in_sync(self) -> bool:
        return self.sync_vote is not None or self.plan is not None


class Model:
    """A client-side model of every connection; checks every action batch of the master."""

    TAGS = (1, 2, 3)
    RANKED = 3  # the tag launched as an all-gather (a ranked kind: its launch epoch counts)

    def __init__(self, rng: random.Random, n_peers: int, groups: list[int] | None = None) -> None:
        self.rng = rng
        self.h = Harness(heartbeat_timeout=5.0)
        self.peers: dict[int, _P] = {}  # live connections
        self.dead: list[int] = []  # closed by the master, Disconnected not yet reported
        self.last_seq = 0
        self.tickets: dict[tuple[int, int], int] = {}  # (group, tag) -> ticket handed out
        self.seq_tag: dict[int, tuple[int, int]] = {}  # seq -> (group, tag)
        self.seq_members: dict[int, set[int]] = {}
        self.ok_done: dict[int, set[int]] = {}
        self.last_epoch = 0
        self.rings: dict[tuple[int, int], tuple[int, ...]] = {}  # (group, epoch) -> its ring
        self.revisions: dict[int, int] = {}  # group -> last elected revision
        self.elections: dict[int, Election] = {}  # group -> sync started in this batch
        self.sync_parts: dict[int, set[int]] = {}  # group -> participants of its running sync
        self.awaiting_plan: set[int] = set()  # must get a SyncPlan or SyncFailed in this batch
        self.sync_kicks: set[int] = set()  # must be kicked by the election in this batch
        # (conn, tag) -> the element count of its last vote (8, or the odd 9): a lone
        # dissenter among three or more voters is kicked (issue 31), the others start
        self.counts: dict[tuple[int, int], int] = {}
        self.completing: dict[int, set[int]] = {}  # group -> still to get this SyncComplete
        self.deadlock: set[tuple[int, str | int]] | None = None  # answers still due in this batch
        for i in range(n_peers):
            self.new_peer(None if groups is None else groups[i])
        self.apply_legal_topology_round()

    # -- driving --
    def live(self, accepted: bool | None = None) -> list[int]:
        return sorted(c for c, p in self.peers.items()
                      if accepted is None or (p.accepted == accepted and p.registered))

    def event(self, ev: ms.Event, offender: int | None = None) -> list[ms.Action]:
        acts = self.h.handle(ev)
        self.check(acts, offender)
        return acts

    def send(self, conn: int, msg: m.PeerToMaster, legal: bool) -> list[ms.Action]:
        return self.event(ms.Received(conn, msg, self.h.now), None if legal else conn)

    def new_peer(self, group: int | None = None) -> None:
        conn = self.h.connect()
        group = self.rng.choice((0, 0, 1)) if group is None else group
        self.peers[conn] = _P(group=group, registered=True)
        self.send(conn, m.Hello(PV, self.peers[conn].group, 40000 + conn), legal=True)

    def apply_legal_topology_round(self) -> None:
        for c in self.live(accepted=True):
            p = self.peers.get(c)
            if p and not p.voted_topology and not p.outstanding:
                p.voted_topology = True
                self.send(c, m.VoteUpdateTopology(), legal=True)

    def step(self) -> None:
        rng = self.rng
        kind = rng.choices(
            ["init", "done", "topology", "pending", "disconnect", "leave", "tick", "join",
             "malformed", "echo", "stale", "group init", "group topology", "withdraw",
             "sync", "group sync", "sync done", "stray sync done", "withdraw vote", "wait",
             "stray wait"],
            weights=[30, 25, 12, 4, 3, 2, 8, 4, 1, 2, 3, 6, 2, 2, 6, 4, 10, 1, 3, 12, 2])[0]
        live = self.live()
        accepted = self.live(accepted=True)
        if kind == "join" and len(self.peers) < 6:
            self.new_peer()
        elif kind == "init" and accepted:
            c = rng.choice(accepted)
            p = self.peers[c]
            if p.in_sync():
                return
            if sum(self.peers[x].group == p.group for x in accepted) < 2 and rng.random() < 0.8:
                return  # mostly skip the TOO_FEW_PEERS case, it is cheap to reach
            tag = rng.choice(self.TAGS)
            legal = tag not in p.outstanding and not p.voted_topology
            if not legal and rng.random() < 0.9:
                return
            if legal:
                p.outstanding[tag] = 0
            count = 8 if rng.random() < 0.93 else 9
            if legal:
                self.counts[(c, tag)] = count
            self.send(c, self.init(p, tag, count, legal), legal)
        elif kind == "done":
            cands = [(c, t) for c in accepted for t, s in self.peers[c].outstanding.items()
                     if s and t not in self.peers[c].done_sent]
            if cands:
                c, tag = rng.choice(cands)
                p = self.peers[c]
                p.done_sent.add(tag)
                ok = rng.random() < 0.85
                if ok:
                    self.ok_done.setdefault(p.outstanding[tag], set()).add(c)
                self.send(c, m.CollectiveDone(tag, p.outstanding[tag], ok, "x"), legal=True)
        elif kind == "withdraw":
            cands = [(c, t) for c in accepted for t, s in self.peers[c].outstanding.items()
                     if s == 0]
            if cands:
                c, tag = rng.choice(cands)
                self.send(c, m.CollectiveDone(tag, 0, False, "cancelled"), legal=True)
        elif kind == "stale" and accepted:
            c = rng.choice(accepted)
            self.send(c, m.CollectiveDone(rng.choice(self.TAGS),
                                          rng.randrange(0, self.last_seq + 3), False, "stale"),
                      legal=True)
        elif kind == "topology" and accepted:
            c = rng.choice(accepted)
            if self.peers[c].outstanding and rng.random() < 0.5:
                c = rng.choice(accepted)  # prefer peers that may legally vote
            p = self.peers[c]
            legal = not p.voted_topology and not p.outstanding
            if p.in_sync() or (not legal and rng.random() < 0.9):
                return
            p.voted_topology = True
            self.send(c, m.VoteUpdateTopology(), legal)
        elif kind == "pending" and live:
            c = rng.choice(live)
            p = self.peers[c]
            legal = p.accepted and not p.voted_pending
            if not legal and rng.random() < 0.9:
                return
            p.voted_pending = True
            self.send(c, m.VotePeersPending(), legal)
        elif kind == "disconnect" and live:
            self.disconnect(rng.choice(live))
        elif kind == "leave" and live:
            self.send(rng.choice(live), m.Leave(), legal=True)
        elif kind == "malformed" and live:
            c = rng.choice(live)
            self.event(ms.Malformed(c, "garbage", self.h.now, b"\xc1"), offender=c)
        elif kind == "echo" and self.dead:
            c = self.dead.pop(rng.randrange(len(self.dead)))
            assert self.h.handle(ms.Disconnected(c, self.h.now)) == []
        elif kind == "group init" and accepted:
            # a well-behaved group: every member that may launch ``tag`` does, same descriptor
            group = self.peers[rng.choice(accepted)].group
            tag = rng.choice(self.TAGS)
            for c in accepted:
                p = self.peers.get(c)
                if (p and p.group == group and tag not in p.outstanding and not p.voted_topology
                        and not p.in_sync()):
                    p.outstanding[tag] = 0
                    self.send(c, self.init(p, tag, 8, True), legal=True)
        elif kind == "group topology":
            for c in accepted:
                p = self.peers.get(c)
                if p and not p.voted_topology and not p.outstanding and not p.in_sync():
                    p.voted_topology = True
                    self.send(c, m.VoteUpdateTopology(), legal=True)
        elif kind == "tick":
            self.h.now += rng.uniform(0.0, 3.0)
            for c in live:
                if rng.random() < 0.85:
                    self.send(c, m.Heartbeat(), legal=True)
            self.event(ms.Tick(self.h.now))
        elif kind == "sync" and accepted:
            self.vote_sync(rng.choice(accepted), strict=False)
        elif kind == "group sync" and accepted:
            group = self.peers[rng.choice(accepted)].group
            for c in accepted:
                p = self.peers.get(c)
                if p and p.group == group:
                    self.vote_sync(c, strict=True)
        elif kind == "sync done":
            cands = [c for c in accepted if self.peers[c].plan and self.peers[c].sync_done is None]
            if cands:
                c = rng.choice(cands)
                ok = rng.random() < 0.9
                self.peers[c].sync_done = ok
                self.send(c, m.SyncDone(ok, "" if ok else "fetch failed"), legal=True)
        elif kind == "stray sync done" and live:
            c = rng.choice(live)
            p = self.peers[c]
            if not (p.plan and p.sync_done is None) and rng.random() < 0.3:
                self.send(c, m.SyncDone(True), legal=False)
        elif kind == "withdraw vote" and live:
            c = rng.choice(live)
            vote = rng.choice(("topology", "pending"))
            if vote == "topology":
                self.peers[c].voted_topology = False
            else:
                self.peers[c].voted_pending = False
            acts = self.send(c, m.WithdrawVote(vote), legal=True)
            assert [a for a in acts if isinstance(a.msg, m.VoteWithdrawn)] == [
                ms.Send(c, m.VoteWithdrawn(vote))], "a withdrawal is acknowledged once"
            assert all(getattr(a.msg, "deadlock", False) for a in acts
                       if not isinstance(a.msg, m.VoteWithdrawn)), \
                "a withdrawal has no other reply (it may leave others deadlocked, though)"
        elif kind == "wait":
            cands = [(c, t) for c in accepted for t, s in self.peers[c].outstanding.items()
                     if s == 0 and t not in self.peers[c].awaited]
            if cands:
                c, tag = rng.choice(cands)
                self.peers[c].awaited.add(tag)
                self.send(c, m.CollectiveWait(tag), legal=True)
        elif kind == "stray wait" and accepted:
            # a Wait for a tag that started, ended, was never launched, or again: ignored
            c = rng.choice(accepted)
            tag = rng.choice((*self.TAGS, 99))
            p = self.peers[c]
            if p.outstanding.get(tag) != 0 or tag in p.awaited:
                assert self.send(c, m.CollectiveWait(tag), legal=True) == []

    def init(self, p: _P, tag: int, count: int, legal: bool) -> m.CollectiveInit:
        """The vote for ``tag``: an all-reduce, or (``RANKED``) an all-gather launched in the
        peer's epoch."""
        if tag != self.RANKED:
            return m.CollectiveInit(tag, count, 10, 0)
        if legal:
            p.launched_in[tag] = p.epoch
        return m.CollectiveInit(tag, count, 10, 0, kind=3, epoch=p.epoch)

    def vote_sync(self, c: int, strict: bool) -> None:
        """``c`` votes; mostly legal votes (``strict``: only), sometimes ones the election kicks."""
        rng, p = self.rng, self.peers[c]
        if p.plan is not None and p.sync_done is not None:
            return  # waits for SyncComplete: makes no call meanwhile
        legal = not p.outstanding and not p.voted_topology and not p.in_sync()
        if not legal and (strict or rng.random() < 0.9):
            return
        revision = p.revision + rng.choices((0, 1, 2), (70, 28, 2))[0]
        strategy = rng.choices([*SyncStrategy, 3], (36, 1, 1, 0 if strict else 1))[0]
        legal = legal and isinstance(strategy, SyncStrategy)  # 3: unknown, a kick
        vote = sync_vote(revision, rng.choice((1, 1, 2)), nbytes=64 if rng.random() < 0.97 else 65,
                         strategy=strategy, fresh=p.fresh)
        if legal:
            p.sync_vote, p.revision = vote, revision
        self.send(c, vote, legal)

    def disconnect(self, c: int) -> None:
        self.gone(c, self.peers.pop(c))
        self.event(ms.Disconnected(c, self.h.now))
        self.h.closed.add(c)

    def gone(self, c: int, p: _P) -> None:
        """``c`` left: it no longer takes part in its group's sync."""
        parts = self.sync_parts.get(p.group)
        if parts is not None:
            parts.discard(c)
            if not parts:
                del self.sync_parts[p.group]
        if p.accepted and not any(q.accepted and q.group == p.group
                                  for x, q in self.peers.items() if x != c):
            self.revisions.pop(p.group, None)  # an empty group starts afresh

    def finish(self) -> None:
        """Everyone but one accepted peer leaves: the survivor must have no vote outstanding."""
        accepted = self.live(accepted=True)
        if not accepted:
            return
        survivor = self.rng.choice(accepted)
        for c in self.live():
            if c != survivor and c in self.peers:
                self.disconnect(c)
        if survivor not in self.peers:
            return  # kicked by the election of the sync its vote started alone (a revision skip)
        p = self.peers[survivor]
        assert p.outstanding == {}, f"survivor {survivor} still waits for {p.outstanding}"
        assert not p.voted_topology and not p.voted_pending
        assert p.sync_vote is None, "a lone voter's sync did not start"
        if p.plan is not None and p.sync_done is None:
            p.sync_done = True
            self.send(survivor, m.SyncDone(True), legal=True)
        assert p.plan is None, "the survivor never got its SyncComplete"

    def lone_dissenter(self, conn: int, reason: str) -> bool:
        """Was ``conn`` kicked for the odd element count it voted, against the others' 8?"""
        found = re.fullmatch(r"collective tag (\d+): its .* \(all-\w+ 9 x .*\) disagrees with "
                             r"every other member's \(all-\w+ 8 x .*\)", reason)
        return found is not None and self.counts.get((conn, int(found.group(1)))) == 9

    # -- checking --
    def check(self, acts: list[ms.Action], offender: int | None) -> None:
        i = 0
        while i < len(acts):
            a = acts[i]
            if isinstance(a, ms.Close):
                p = self.peers.pop(a.conn, None)
                if p is not None:
                    self.dead.append(a.conn)
                    self.gone(a.conn, p)
                i += 1
                continue
            p = self.peers[a.conn]
            msg = a.msg
            started = isinstance(msg, m.SyncPlan) or (
                isinstance(msg, m.SyncFailed) and not msg.completed)
            if started or (isinstance(msg, m.Kicked) and a.conn != offender
                           and p.sync_vote is not None):
                self.sync_started(p.group)
            match msg:
                case m.Kicked():
                    assert a.conn == offender or a.conn in self.sync_kicks or \
                        self.lone_dissenter(a.conn, msg.reason), \
                        f"legal behaviour of {a.conn} was kicked: {msg}"
                    self.sync_kicks.discard(a.conn)
                    assert acts[i + 1] == ms.Close(a.conn, acts[i + 1].reason)
                case m.Rejected():
                    raise AssertionError(f"unexpected {msg}")
                case m.Welcome():
                    assert p.registered
                    p.accepted = p.accepted or msg.accepted
                case m.Membership():
                    i = self.check_membership(acts, i)
                    continue
                case m.TopologyUpdated():
                    assert p.voted_topology and p.accepted
                    p.voted_topology = False
                case m.VoteRejected(kind="topology"):
                    assert p.voted_topology and p.accepted
                    self.deadlock_answer(a.conn, "topology", msg)
                    p.voted_topology = False
                case m.VoteRejected(kind="pending"):
                    assert msg.deadlock and p.voted_pending and p.accepted
                    self.deadlock_answer(a.conn, "pending", msg)
                    p.voted_pending = False
                case m.VoteRejected(kind="sync"):
                    assert msg.deadlock and p.sync_vote is not None and p.accepted
                    self.deadlock_answer(a.conn, "sync", msg)
                    p.sync_vote = None
                case m.PeersPendingAnswer():
                    assert p.voted_pending and p.accepted
                    p.voted_pending = False
                case m.CollectiveStart():
                    i = self.check_start(acts, i)
                    continue
                case m.CollectiveComplete(tag=tag, seq=seq, next_seq=nxt):
                    assert p.outstanding.get(tag) == seq, (a, p)
                    if nxt and self.tickets.get((p.group, tag)) != nxt:
                        # a ticket (the others of the batch get the same): never a seq seen
                        assert nxt > self.last_seq, (a, p)
                        self.tickets[(p.group, tag)] = self.last_seq = nxt
                    assert self.ok_done.get(seq, set()) >= self.seq_members[seq], "early complete"
                    self.terminal(p, tag)
                case m.CollectiveAbort(tag=tag, seq=seq):
                    assert tag in p.outstanding and p.outstanding[tag] == seq, (a, p)
                    self.terminal(p, tag)
                case m.CollectiveRejected(tag=tag):
                    assert p.outstanding.get(tag) == 0, (a, p)
                    self.deadlock_answer(a.conn, tag, msg)
                    self.terminal(p, tag)
                case m.SyncFailed(completed=True) | m.SyncComplete():
                    self.check_complete(a.conn, p, msg)
                case m.SyncPlan() | m.SyncFailed():
                    self.check_plan(a.conn, p, msg)
                case m.MasterHeartbeat() | m.VoteWithdrawn():
                    pass  # an acknowledgement is checked where the withdrawal is sent
                case _:
                    raise AssertionError(msg)
            i += 1
        if offender is not None:
            assert offender in self.dead or offender not in self.peers, \
                f"illegal message of {offender} not punished: {acts}"
        self.check_sync_batch()
        assert not self.deadlock, f"deadlocked calls left unanswered: {self.deadlock}"
        self.deadlock = None
        assert not stuck_peers(*self.wait_graph()), "peers were left deadlocked"

    # -- deadlocks --
    def wait_graph(self) -> tuple[dict[int, int], dict[int, set[Item]], dict[Item, set[int]]]:
        """(accepted peer -> group, what each waits on, who cast each item): ``stuck_peers``."""
        members = {c: p.group for c, p in self.peers.items() if p.accepted}
        waits: dict[int, set[Item]] = {}
        voters: dict[Item, set[int]] = {}
        for c in members:
            p = self.peers[c]
            items: set[Item] = {item for item, on in ((("topology", 0, 0), p.voted_topology),
                                                      (("pending", 0, 0), p.voted_pending),
                                                      (("sync", p.group, 0), bool(p.sync_vote)))
                                if on}
            for tag in [t for t, seq in p.outstanding.items() if seq == 0]:
                if tag in p.awaited:
                    items.add(("collective", p.group, tag))
                voters.setdefault(("collective", p.group, tag), set()).add(c)
            for item in items:
                voters.setdefault(item, set()).add(c)
            waits[c] = items
        return members, waits, voters

    def deadlock_answer(self, c: int, call: str | int, msg: m.VoteRejected | m.CollectiveRejected
                        ) -> None:
        """A call of ``c`` failed (``call``: a vote's kind or a tag); with ``deadlock`` set it is
        one of the calls the rule names, seen before the model forgets any of them."""
        if not msg.deadlock:
            return
        if self.deadlock is None:  # the batch's first: compute every answer due
            members, waits, voters = self.wait_graph()
            stuck = stuck_peers(members, waits, voters)
            assert stuck, f"{msg} to {c}, but nobody is deadlocked"
            self.deadlock = set()
            for x in stuck:
                self.deadlock |= {(x, item[0]) for item in waits[x] if item[0] != "collective"}
                self.deadlock |= {(v, item[2]) for item in waits[x] if item[0] == "collective"
                                  for v in voters[item]}
            self.deadlock_reason = msg.reason
            assert msg.reason.startswith("deadlock: ")
            assert all(f"peer {x} waits in" in msg.reason for x in sorted(stuck)[:8]), msg.reason
        assert (c, call) in self.deadlock, f"{msg} to {c}: not a deadlocked call"
        assert msg.reason == self.deadlock_reason, "one deadlock, one reason"
        self.deadlock.discard((c, call))

    def sync_started(self, group: int) -> None:
        """The master started ``group``'s sync in this batch: the model's election."""
        if group in self.elections:
            return
        members = sorted(c for c, p in self.peers.items() if p.accepted and p.group == group)
        votes = {c: self.peers[c].sync_vote for c in members}
        assert all(votes.values()), f"group {group}'s sync started before all voted: {votes}"
        assert group not in self.sync_parts, "a sync started while the last one runs"
        e = elect({c: v for c, v in votes.items() if v}, self.revisions.get(group))
        self.elections[group] = e
        for c in members:
            self.peers[c].sync_vote = None
        self.awaiting_plan |= set(members) - set(e.kicks)
        self.sync_kicks |= set(e.kicks)
        if not e.failed:
            self.revisions[group] = e.revision
            self.sync_parts[group] = set(members) - set(e.kicks)

    def check_plan(self, c: int, p: _P, msg: m.SyncPlan | m.SyncFailed) -> None:
        assert c in self.awaiting_plan, f"{msg} to {c}: no vote of it started a sync"
        self.awaiting_plan.discard(c)
        e = self.elections[p.group]
        if isinstance(msg, m.SyncFailed):
            assert e.failed and msg.reason == e.failed
            return
        assert not e.failed and msg.revision == e.revision
        plan = e.plans.get(c)
        assert (msg.keys, msg.hashes) == ((plan.keys, plan.hashes) if plan else ([], []))
        assert [s.peer_id for s in msg.sources] == e.sources
        p.plan, p.sync_done = msg, None

    def check_complete(self, c: int, p: _P, msg: m.SyncComplete | m.SyncFailed) -> None:
        """SyncComplete when every part succeeded, SyncFailed(completed) to all if one failed."""
        group = p.group
        if group not in self.completing:  # the first of this sync's closing messages
            parts = self.sync_parts.pop(group)
            assert all(self.peers[x].sync_done is not None for x in parts), "early SyncComplete"
            failed = any(self.peers[x].sync_done is False for x in parts)
            assert isinstance(msg, m.SyncFailed) == failed, (msg, parts)
            self.completing[group] = parts
        assert c in self.completing[group], f"{c}: not a participant, or a second SyncComplete"
        self.completing[group].discard(c)
        assert p.plan is not None
        if isinstance(msg, m.SyncFailed):
            p.plan, p.sync_done = None, None
            return
        assert msg.revision == p.plan.revision
        if p.sync_done:
            p.revision, p.fresh = msg.revision, False
        p.plan, p.sync_done = None, None

    def check_sync_batch(self) -> None:
        """After a batch: every started sync answered everyone; nothing left undone."""
        assert not self.awaiting_plan, f"no SyncPlan/SyncFailed for {self.awaiting_plan}"
        assert not self.sync_kicks, f"the election's kicks of {self.sync_kicks} did not happen"
        for group, left in self.completing.items():
            assert not left, f"group {group}: {left} got no SyncComplete"
        self.completing.clear()
        self.elections.clear()
        for group in {p.group for p in self.peers.values()}:
            members = [p for p in self.peers.values() if p.accepted and p.group == group]
            assert not members or not all(p.sync_vote for p in members), \
                f"group {group}: every member voted, the sync did not start"
            parts = self.sync_parts.get(group, set())
            assert not parts or not all(self.peers[c].sync_done is not None for c in parts), \
                f"group {group}: everyone reported SyncDone, the sync did not complete"

    @staticmethod
    def terminal(p: _P, tag: int) -> None:
        del p.outstanding[tag]
        p.done_sent.discard(tag)
        p.awaited.discard(tag)

    def check_membership(self, acts: list[ms.Action], i: int) -> int:
        j = i
        batch: dict[int, m.Membership] = {}
        epoch = acts[i].msg.epoch
        while j < len(acts) and isinstance(acts[j], ms.Send) \
                and isinstance(acts[j].msg, m.Membership) and acts[j].msg.epoch == epoch:
            assert acts[j].conn not in batch
            batch[acts[j].conn] = acts[j].msg
            j += 1
        assert epoch > self.last_epoch
        self.last_epoch = epoch
        previously = {c for c, p in self.peers.items() if p.accepted}
        assert previously <= set(batch), "an accepted peer missed a membership update"
        for c in set(batch) - previously:
            assert self.peers[c].registered  # a newcomer: it was pending
        for c, mm in batch.items():
            p = self.peers[c]
            group = sorted(x for x in batch if self.peers[x].group == p.group)
            assert ring_ids(mm) == group
            self.rings[(p.group, epoch)] = tuple(group)
            assert mm.global_world_size == len(batch)
            sizes = [sum(1 for x in batch if self.peers[x].group == g)
                     for g in {self.peers[x].group for x in batch}]
            assert mm.num_groups == len(sizes) and mm.largest_group_world_size == max(sizes)
            p.accepted = True
            p.epoch = mm.epoch
        return j

    def check_start(self, acts: list[ms.Action], i: int) -> int:
        first = acts[i].msg
        group = self.peers[acts[i].conn].group
        ticket = self.tickets.pop((group, first.tag), None)
        if first.seq != ticket:  # a fresh seq, or the tag's ticket (handed out with a verdict)
            assert first.seq > self.last_seq, f"seq {first.seq} after {self.last_seq}"
        self.last_seq = max(self.last_seq, first.seq)
        j = i
        members: set[int] = set()
        while j < len(acts) and isinstance(acts[j], ms.Send) \
                and isinstance(acts[j].msg, m.CollectiveStart) and acts[j].msg.seq == first.seq:
            c, msg = acts[j].conn, acts[j].msg
            p = self.peers[c]
            assert msg.tag == first.tag
            assert p.outstanding.get(msg.tag) == 0, (acts[j], p)
            assert msg.epoch == p.epoch == self.last_epoch
            p.outstanding[msg.tag] = msg.seq
            p.awaited.discard(msg.tag)
            members.add(c)
            j += 1
        group = self.peers[acts[i].conn].group
        assert members == {c for c, p in self.peers.items() if p.accepted and p.group == group}
        assert len(members) >= 2
        if first.tag == self.RANKED:  # only in the ring every voter launched it in
            ring = tuple(sorted(members))
            for c in members:
                launched = self.peers[c].launched_in[first.tag]
                assert self.rings[(group, launched)] == ring, (c, launched, ring)
        self.seq_members[first.seq] = members
        return j


def _drive(rng: random.Random, steps: int) -> None:
    model = Model(rng, rng.randint(2, 5))
    for _ in range(steps):
        model.step()
    model.finish()


@pytest.mark.parametrize("chunk", range(4))
def test_randomized_master_invariants_seeded(chunk: int) -> None:
    for seed in range(chunk * 100, chunk * 100 + 100):
        _drive(random.Random(seed), 120)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rng=st.randoms(use_true_random=False), steps=st.integers(1, 150))
def test_randomized_master_invariants_hypothesis(rng: random.Random, steps: int) -> None:
    _drive(rng, steps)


def test_model_detects_a_second_terminal_message() -> None:
    """The invariant checker itself can fail (guards against a vacuous randomized test)."""
    model = Model(random.Random(0), 2, groups=[0, 0])
    a, b = model.live(accepted=True)
    for c in (a, b):
        model.peers[c].outstanding[1] = 0
        model.send(c, m.CollectiveInit(1, 8, 10, 0), legal=True)
    seq = model.peers[a].outstanding[1]
    assert seq > 0
    dup = [ms.Send(a, m.CollectiveAbort(1, seq, "x")), ms.Send(a, m.CollectiveAbort(1, seq, "y"))]
    with pytest.raises((AssertionError, KeyError)):
        model.check(dup, None)


@pytest.mark.parametrize("silent", [True, False], ids=["unanswered", "answered twice"])
def test_model_detects_a_wrong_deadlock_verdict(silent: bool, monkeypatch) -> None:
    """The deadlock invariants can fail: a master that leaves two peers waiting on different
    tags, or answers one of their calls twice."""
    model = Model(random.Random(0), 2, groups=[0, 0])
    a, b = model.live(accepted=True)
    if silent:
        monkeypatch.setattr(ms.MasterState, "_settle", lambda self, out: None)
    for c, tag in ((a, 1), (b, 2)):
        model.peers[c].outstanding[tag] = 0
        model.send(c, m.CollectiveInit(tag, 8, 10, 0), legal=True)
        model.peers[c].awaited.add(tag)
        if silent and c == b:
            with pytest.raises(AssertionError, match="left deadlocked"):
                model.send(c, m.CollectiveWait(tag), legal=True)
            return
        model.send(c, m.CollectiveWait(tag), legal=True)
    assert model.peers[a].outstanding == {} and model.peers[b].outstanding == {}
    again = [ms.Send(a, m.CollectiveRejected(1, "deadlock: again", True))]
    with pytest.raises(AssertionError):
        model.check(again, None)


@pytest.mark.parametrize("done", [True, False], ids=["second", "early"])
def test_model_detects_a_wrong_sync_complete(done: bool) -> None:
    """The sync invariants can fail too: a second SyncComplete, or one before all were done."""
    model = Model(random.Random(0), 2, groups=[0, 0])
    a, b = model.live(accepted=True)
    for c in (a, b):
        model.peers[c].sync_vote = sync_vote()
        model.send(c, sync_vote(), legal=True)
    assert model.peers[a].plan and model.peers[b].plan
    if done:
        for c in (a, b):
            model.peers[c].sync_done = True
            model.send(c, m.SyncDone(True), legal=True)
        assert model.peers[a].plan is None
    wrong = [ms.Send(a, m.SyncComplete(0)), ms.Send(b, m.SyncComplete(0))]
    with pytest.raises((AssertionError, KeyError)):
        model.check(wrong, None)


# ---- handle never raises, whatever arrives in whatever order ----------------------------------

def _weighted(*branches: tuple[int, st.SearchStrategy]) -> st.SearchStrategy:
    """One of ``branches``: a branch of weight w is drawn about w times as often as one of 1."""
    table = [branch for weight, branch in branches for _ in range(weight)]
    return st.integers(0, len(table) - 1).flatmap(lambda i: table[i])


_small = st.integers(-1, 3)
_entries = st.lists(st.builds(  # few layouts, so that votes often agree on one
    m.SyncEntry, st.just("w"), st.just(1), st.just(64),
    st.sampled_from([b"", b"\x01" * 16, b"\x02" * 16]), st.booleans()), max_size=1)
_messages = _weighted(  # mostly votes; few Hellos (a second one is a kick)
    (4, st.builds(m.VoteSync, _small, _small, _entries, st.booleans())),
    (1, st.builds(m.SyncDone, st.booleans())),
    (1, st.builds(m.CollectiveInit, _small, st.integers(1, 2), _small, _small)),
    (1, st.builds(m.CollectiveDone, _small, _small, st.booleans())),
    (1, st.builds(m.CollectiveWait, _small)),
    (2, st.sampled_from([m.Heartbeat(), m.VoteUpdateTopology(), m.VotePeersPending(), m.Leave(),
                         m.WithdrawVote("topology"), m.WithdrawVote("pending")])),
    (1, st.builds(m.Hello, st.sampled_from([PV, PV + 1]), st.integers(-1, 1),
                  st.sampled_from([0, 5000, 70000]), st.sampled_from(["", "10.0.0.1"]),
                  st.integers(0, 1))),
)
_conns = st.integers(1, 6)
_events = st.lists(_weighted(
    (7, st.tuples(st.just("recv"), _conns, _messages)),
    (1, st.tuples(st.just("connect"), _conns)),
    (1, st.tuples(st.just("malformed"), _conns, st.sampled_from([b"", b"\xc1"]))),
    (1, st.tuples(st.just("disconnect"), _conns)),
    (1, st.tuples(st.just("tick"), st.floats(0.0, 4.0))),
), min_size=10, max_size=60)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_events)
def test_handle_never_raises_on_any_event_sequence(events: list[tuple]) -> None:
    """Any message from any connection in any state, votes on any terms: actions, never an
    exception (the Harness also checks that nothing is sent after a Close)."""
    h = Harness(heartbeat_timeout=5.0)
    seen = set(h.run(0, 0, 0, 1))  # the transport never reuses a connection id
    for ev in events:
        match ev:
            case ("connect", conn) if conn not in seen:
                seen.add(conn)
                h.handle(ms.Connected(conn, "127.0.0.1", h.now))
            case ("recv", conn, msg) if conn in seen and conn not in h.closed:
                h.send(conn, msg)
            case ("malformed", conn, body) if conn in seen and conn not in h.closed:
                h.malformed(conn, "garbage", body)
            case ("disconnect", conn) if conn in seen:
                h.disconnect(conn)
            case ("tick", dt):
                h.tick(h.now + dt)
