"""Master fail-over, sans-IO: terms, the run id, peer ids, rebuilds and stepping down.

``Failover`` owns all of it and reaches the master's state only through ``Master`` (admit,
close, restore, publish), as the collectives and the sync barrier do through their rosters.

Terms. A master's ``term`` is 0 until it serves a run; a run it starts is term 1, a run it
rebuilds from rejoining peers (``recovery.py``) gets one above every term they followed.
Peers follow terms upwards only (``Membership.term``). A master that finds another master
of its run serving a higher term with members (its own probe of that master, ``heard``)
steps down: it ends every session with ``Superseded`` (the peers rejoin wherever the run is
served now, the highest term they can reach) and serves that term's run from then on only
as a fresh rebuild. A peer's ``Hello`` naming a higher term is no such evidence (any member
could send one): a master with members refuses it (the peer belongs where that term is
served) and keeps its members and its term (a term taken on one peer's word could be
2**63 - 1, leaving no term above it for the next rebuild). Hence a peer never goes back to
an older term, and no member ends the others' sessions.
"""

from __future__ import annotations

import secrets
from collections.abc import Container, Iterable
from typing import Protocol

from ..._wire import messages as m
from ..._wire.recovery import REBUILT_WITHOUT
from .events import Action, Send
from .recovery import Outcome, Recovery

__all__ = ["Failover", "Master"]

_ID_END = 2**63  # peer ids are below it (``_wire.fields.U63``)
_REFUSED = 2**62  # ids of peers whose claim to rejoin was refused start here


class Master(Protocol):
    """What fail-over needs from the master's state."""

    @property
    def now(self) -> float:
        """The time of the event being handled."""

    def accepted(self, group: int | None = None) -> list[int]:
        """Accepted peers (of ``group``), ascending."""

    def registered(self) -> list[int]:
        """Every peer that said ``Hello`` (members and joiners)."""

    def admit(self, conns: Iterable[int] | None = None) -> list[int]:
        """Accept ``conns`` (default: every joiner) as members; returns them."""

    def close(self, conns: list[int], reason: str, out: list[Action]) -> None:
        """End these sessions (``Close``, departure), the first as one that said goodbye
        (``Leave``: no rebuild waits for it; a master that steps down drops any rebuild)."""

    def restore(self, outcome: Outcome) -> None:
        """Take a rebuilt run's rings, revisions and floors; the registered peers that are
        not members wait for admission."""

    def publish(self, out: list[Action]) -> int:
        """A new epoch, its ``Membership`` to every member; returns the epoch."""


class Failover:
    """The run this master serves (``term``, ``run_id``), the ids it hands out, and the
    rebuild of a run from rejoining peers (``recovery.Recovery``)."""

    def __init__(self, master: Master, run_id: str, grace: float) -> None:
        """``run_id``: only peers of this run are adopted ("": the run of the first peer);
        ``grace``: how long a rebuilt run waits for the members that have not rejoined."""
        self._master = master
        self.run_id, self._fixed_run = run_id, bool(run_id)
        self.term = 0  # 0: no run yet; a rebuilt run's is above every term its peers followed
        self.grace = grace
        self._recovery: Recovery | None = None
        self._max_id = 0  # the highest peer id used or reported (fresh ids go above it)
        self._refused = 0  # the last id given to a refused claim (``allocate``)
        self._owed: dict[int, dict[str, m.MasterToPeer]] = {}  # answers a rebuild owes
        self._fresh_run: float | None = None  # when a new peer started the run here
        self._random_run = False  # ... and its run id is one this master made up

    # ---- queries ---------------------------------------------------------------------------------
    @property
    def rebuilding(self) -> bool:
        """A run is being rebuilt (rejoins are collected)."""
        return self._recovery is not None

    def rebuild(self) -> tuple[list[int], list[int]] | None:
        """A run being rebuilt: the peers that rejoined so far and the members still
        awaited; None otherwise."""
        rec = self._recovery
        return None if rec is None else (sorted(rec.members()), sorted(rec.missing()))

    def allocate(self, wanted: int, used: Container[int], refused: bool = False) -> int:
        """The peer id of a new connection: ``wanted`` (a rejoining peer's own) if not
        ``used``, else one above every id used or reported. ``refused``: a claim to rejoin
        that this master did not believe (no valid seal): an id from far above (``_REFUSED``),
        which no member of the run it may be about to rebuild holds (a low fresh id made a
        member that came back a moment later a joiner under another id)."""
        if refused:
            self._refused = max(self._refused + 1, _REFUSED)
            while self._refused in used:
                self._refused += 1
            return self._refused
        if not (0 < wanted < _ID_END) or wanted in used:
            wanted = self._max_id + 1
            if wanted >= _ID_END:  # claimed ids reached the top: the lowest free one
                wanted = next(i for i in range(1, _ID_END) if i not in used)
        self._max_id = max(self._max_id, wanted)
        return wanted

    def probe(self) -> m.ProbeAnswer:
        """What this master tells a ``Probe``: its term, run and member count."""
        rec = self._recovery
        members = len(self._master.accepted()) + (len(rec.members()) if rec else 0)
        return m.ProbeAnswer(self.term, self.run_id, members)

    # ---- a Hello --------------------------------------------------------------------------------
    def screen(self, msg: m.Hello, out: list[Action]) -> str | None:
        """Why ``msg`` may not join this master's run (None: it may). A rejoining peer
        takes a ``provisional`` run over; a peer of a higher term is refused while this
        master has members (during a rebuild, the rejoins' own terms count: ``_rejoined``)."""
        self.take_over(msg, out)
        if msg.run_id and self.run_id and msg.run_id != self.run_id and (
                self._fixed_run or self.term):
            return (f"this peer belongs to run {msg.run_id!r}; "
                    f"this master serves run {self.run_id!r}")
        if msg.term > self.term and self._master.accepted():
            # One peer's word is no evidence that the run is served elsewhere (any member can
            # send any term): the master keeps its members and term, and steps down only on
            # a probe of that master (``heard``).
            return (f"this peer followed term {msg.term}, above this master's {self.term}: "
                    f"its run is served by a master of a higher term")
        return None

    def take_over(self, msg: m.Hello, out: list[Action]) -> None:
        """A rejoining peer's ``Hello``: if this master's run is ``provisional``, it gives way."""
        if msg.rejoin is not None and self.provisional(msg):
            self.step_down(self.term, out, why="peers of the run rejoin: it goes on here")

    def provisional(self, msg: m.Hello) -> bool:
        """Does a rejoining peer take this master's run over? Yes while that run was started
        by a new peer less than ``grace`` seconds ago and could be the same run (a restarted
        master may hear a new peer before the old members: the run it starts is theirs to
        replace)."""
        same = msg.run_id == self.run_id or (self._random_run and not self._fixed_run)
        fresh = self._fresh_run
        return fresh is not None and self._master.now - fresh < self.grace and same

    def joined(self, conn: int, group: int, msg: m.Hello, out: list[Action],
               complete: bool = True) -> tuple[bool, bool, bool]:
        """A peer registered, the last of its replica to (``complete``): (does it start the
        run, as its first member, with the rest of its replica; is it a joiner, neither the
        first nor in a rebuild; is it a member of the run being rebuilt)."""
        rejoin = msg.rejoin
        rebuilding = rejoin is not None and self._rejoined(conn, group, rejoin, msg.run_id, out)
        first = complete and not rebuilding and not self.rebuilding and not self._master.accepted()
        if first:  # term 1 (unless a later one), the peer's run id or a fresh one
            self.term = max(self.term, 1)
            if not self.run_id:
                self.run_id = msg.run_id or secrets.token_hex(8)
                self._random_run = not msg.run_id
            self._fresh_run = self._master.now  # provisional for ``grace`` seconds
        member = rebuilding and rejoin is not None and rejoin.accepted and rejoin.peer_id == conn
        return first, not (first or rebuilding), member

    def _rejoined(self, conn: int, group: int, rejoin: m.Rejoin, run_id: str,
                  out: list[Action]) -> bool:
        """A rejoining peer registered. Returns whether it takes part in a rebuild; else it
        is a joiner, and its operations in doubt are aborted now."""
        self._max_id = max(self._max_id, rejoin.peer_id, *rejoin.ring)
        if self._recovery is None and not self._master.accepted():
            self._recovery = Recovery(self._master.now, self.grace)
            self.run_id = self.run_id or run_id
        if self._recovery is not None:
            self._recovery.add(conn, group, rejoin, self._master.now)
            self.term = max(self.term, min(rejoin.term + 1, _ID_END - 1))
            return True
        for d in rejoin.doubts:
            if not d.done:
                continue
            why = "its master was lost and the run went on without this peer"
            out.append(Send(conn, m.SyncFailed(why, True) if d.kind else
                            m.CollectiveAbort(d.tag, d.seq, why)))
        return False

    # ---- other masters ---------------------------------------------------------------------------
    def heard(self, answer: m.ProbeAnswer, where: str, out: list[Action]) -> None:
        """Another master of this run serves it at a higher term with members: step down (our
        peers then find it), or, without members, take its term so as never to serve below."""
        if answer.term <= self.term or not answer.members or (
                self.run_id and answer.run_id and answer.run_id != self.run_id):
            return
        if self._master.accepted() or self.rebuilding:
            self.step_down(answer.term, out, where)
        else:
            self.term = answer.term

    def step_down(self, term: int, out: list[Action], where: str = "", why: str = "") -> None:
        """A master of ``term`` above ours serves the run: end every session (``Superseded``),
        forget the run, and take ``term`` as ours (a run rebuilt here from now on is above it).
        (Also how a provisional run gives way to the rejoining one: ``provisional``.)"""
        at = f" at {where}" if where else ""
        reason = why or (f"a master of term {term}{at} serves this run "
                         f"(this one had term {self.term})")
        conns = self._master.registered()
        out.extend(Send(c, m.Superseded(term, reason, where)) for c in conns)
        self._master.close(conns, "superseded", out)  # no rebuild of the run ended here
        self._recovery = None
        self.term = term
        self._fresh_run = None
        if not self._fixed_run:
            self.run_id = ""

    # ---- members --------------------------------------------------------------------------------
    def owed(self, conn: int, kind: str, out: list[Action]) -> bool:
        """A member's vote of ``kind`` for the round whose answer it missed when the old master
        died (``recovery.Outcome.owed``): answered at once, as the others were, and not counted."""
        msg = self._owed.get(conn, {}).pop(kind, None)
        if msg is None:
            return False
        out.append(Send(conn, msg))
        return True

    def forget(self, conn: int, out: list[Action]) -> None:
        """``conn`` departed: it is owed nothing, and a rebuild no longer counts it."""
        self._owed.pop(conn, None)
        if self._recovery is not None:
            self._recovery.forget(conn)
            self.check(out)

    def await_members(self, lost: int) -> None:
        """The last member vanished: wait ``grace`` for the members to rejoin (a frozen or cut
        off master drops them all) before the waiting peers may form a new group."""
        self._recovery = Recovery(self._master.now, self.grace, {lost})

    # ---- the rebuild -----------------------------------------------------------------------------
    def check(self, out: list[Action]) -> None:
        """Finish the rebuild once ``Recovery.ready``."""
        if self._recovery is not None and self._recovery.ready(self._master.now):
            self.finish(out)

    def finish(self, out: list[Action]) -> None:
        """The rebuilt run: members in their ring order, floors above everything seen, the
        revisions, then a ``Membership`` to all and the verdicts of the operations in doubt."""
        rec, self._recovery = self._recovery, None
        assert rec is not None
        o = rec.outcome()
        st = self._master
        st.admit(o.members)
        st.restore(o)
        if not o.members:  # nobody is left to vote the waiting peers in: admit them now
            st.admit()
        membership: list[Action] = []
        epoch = st.publish(membership)
        for kind, (n, answer) in o.rounds.items():
            msg: m.MasterToPeer = (m.PeersPendingAnswer(answer, n) if kind == "pending"
                                   else m.TopologyUpdated(epoch, n))
            for c, kinds in o.owed.items():
                if kind in o.waiting.get(c, ()):
                    out.append(Send(c, msg))  # its vote waits: before the Membership ends it
                elif kind in kinds:
                    self._owed.setdefault(c, {})[kind] = msg  # its next vote gets it at once
        out.extend(membership)
        failed = "the master was lost and not every peer finished it"
        for c, items in o.complete.items():
            out.extend(Send(c, m.CollectiveComplete(tag, seq)) for tag, seq in items)
        for c, items in o.abort.items():
            out.extend(Send(c, m.CollectiveAbort(tag, seq, failed)) for tag, seq in items)
        out.extend(Send(c, m.SyncComplete(rev)) for c, rev in o.synced.items())
        out.extend(Send(c, m.SyncFailed(failed, True)) for c in o.sync_failed)
        # a peer that rejoined as a member and is none (its ring or term is gone, or its id
        # taken) would go on as one: it joins again, as a new member, and knows it
        if o.demoted:
            out.extend(Send(c, m.Superseded(self.term, REBUILT_WITHOUT)) for c in o.demoted)
            self._master.close(o.demoted, "rebuilt without it", out)
