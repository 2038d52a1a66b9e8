"""A master rebuilding a run from the peers that rejoin it (sans-IO; ``MasterState`` holds one).

A fresh master (or one whose every member was lost) that hears a ``Hello`` with a ``Rejoin``
adopts that run: its term becomes one above every term reported. It then collects rejoins
until every member of the last ring of each group is back, or ``grace`` seconds passed.
``Outcome`` is the rebuilt run: each group's ring (the order it had), the epoch and seq
floors, the shared-state revisions, and the verdict of every operation in doubt.

Verdicts. An operation whose verdict was lost with the old master completes iff every
member that reports it finished its part: a complete ring all-reduce on a peer means its
result is final, and the old master only ever completed one that every participant
finished, so "complete" agrees with anything it may have told a peer before dying, and
"abort" can only be decided when no peer was told "complete". A member that does not report
a collective completed it (its data needed every member, so every member had it). A sync
needs no data from a peer that fetches nothing, so every member that had a sync in flight
reports it, finished or not (voted without a plan yet: not finished).
"""

from __future__ import annotations

import dataclasses

from ..._wire import messages as m
from ..._wire.recovery import DOUBT_SYNC

__all__ = ["Outcome", "Recovery"]


@dataclasses.dataclass(slots=True)
class Outcome:
    """The run as rebuilt: ``members`` conn -> group (``rings`` gives their order), the
    ``joiners`` (rejoined peers that were waiting, or whose ring is gone), the floors of the
    epoch and of collective seqs, each group's shared-state revision, and the verdicts to
    send: ``complete``/``abort`` as conn -> [(tag, seq)], ``synced``/``sync_failed`` as
    conn -> revision; ``rounds``: the last round of each joint vote (and its answer), and
    ``owed``: the members that voted in it and missed the answer (their next vote of that
    kind gets it at once: the others went on); ``demoted``: the joiners that rejoined as
    members (their ring or term is gone, or their id taken: they must learn it)."""

    members: dict[int, int]
    rings: dict[int, list[int]]
    joiners: list[int]
    epoch: int
    max_seq: int
    revisions: dict[int, int]
    complete: dict[int, list[tuple[int, int]]]
    abort: dict[int, list[tuple[int, int]]]
    synced: dict[int, int]
    sync_failed: dict[int, int]
    rounds: dict[str, tuple[int, bool]] = dataclasses.field(default_factory=dict)
    owed: dict[int, list[str]] = dataclasses.field(default_factory=dict)
    waiting: dict[int, list[str]] = dataclasses.field(default_factory=dict)
    demoted: list[int] = dataclasses.field(default_factory=list)


class Recovery:
    """The rejoins heard so far (``add``), until ``ready``; then ``outcome``."""

    def __init__(self, started: float, grace: float, expected: set[int] | None = None) -> None:
        self.started, self.grace = started, grace
        self._rejoins: dict[int, tuple[int, m.Rejoin]] = {}  # conn -> (group, its rejoin)
        self._expected = expected or set()  # members this master lost (it waits for them)

    @property
    def term(self) -> int:
        """The highest term a rejoining member followed (a waiting joiner's term is the
        master it waited at, not a run it was in: after a rebuild that never finished it is
        above every member's, and counting it made the members joiners)."""
        return max((r.term for _, r in self._rejoins.values() if r.accepted), default=0)

    def add(self, conn: int, group: int, rejoin: m.Rejoin, now: float) -> None:
        """A peer rejoined at ``now``. The first member of a ring starts the grace again: the
        members' wait counts from the first of them, not from a peer that was waiting to join
        (or whose claim was refused) and came back before them."""
        if rejoin.accepted and rejoin.ring and not self._rings():
            self.started = now
        self._rejoins[conn] = (group, rejoin)

    def members(self) -> list[int]:
        """The peers that rejoined so far."""
        return list(self._rejoins)

    def forget(self, conn: int) -> None:
        self._rejoins.pop(conn, None)

    def _rings(self) -> dict[int, tuple[tuple[int, int], list[int]]]:
        """group -> the newest ring reported for it, with its (term, epoch)."""
        rings: dict[int, tuple[tuple[int, int], list[int]]] = {}
        for group, r in self._rejoins.values():
            if r.accepted and r.ring:
                when = (r.term, r.epoch)
                if group not in rings or when > rings[group][0]:
                    rings[group] = (when, list(r.ring))
        return rings

    def missing(self) -> set[int]:
        """Members of the newest rings that have not rejoined yet."""
        here = set(self._rejoins) | {r.peer_id for _, r in self._rejoins.values()}
        rings = {p for _, ring in self._rings().values() for p in ring}
        return (rings | self._expected) - here

    def ready(self, now: float) -> bool:
        """Every member of the last rings is back, or the grace period is over. Peers that
        were waiting to join know no ring: until a member rejoins, the run is awaited."""
        back = bool(self._rings()) and not self.missing()
        return back or now - self.started >= self.grace

    def outcome(self) -> Outcome:
        """The rebuilt run (see ``Outcome``); call once ``ready``."""
        rings = self._rings()
        top = self.term
        members: dict[int, int] = {}
        joiners: list[int] = []
        for conn, (group, r) in self._rejoins.items():
            ring = rings.get(group)
            # a member: in the newest ring, of the newest term, and under its own id (a peer
            # whose id was taken meanwhile rejoins as a joiner under a fresh one)
            if (r.accepted and r.term == top and ring is not None and conn in ring[1]
                    and conn == r.peer_id):
                members[conn] = group
            else:
                joiners.append(conn)
        out = Outcome(
            members=members, joiners=sorted(joiners),
            demoted=sorted(c for c in joiners if self._rejoins[c][1].accepted),
            rings={g: [p for p in ring if p in members] for g, (_, ring) in rings.items()},
            epoch=max((r.epoch for _, r in self._rejoins.values()), default=0),
            max_seq=max((r.max_seq for _, r in self._rejoins.values()), default=0),
            revisions={}, complete={}, abort={}, synced={}, sync_failed={})
        for conn, group in members.items():
            rev = self._rejoins[conn][1].revision
            if rev >= 0:
                out.revisions[group] = max(out.revisions.get(group, -1), rev)
        self._verdicts(members, out)
        self._rounds(members, out)
        return out

    def _rounds(self, members: dict[int, int], out: Outcome) -> None:
        for conn in members:  # the last round; its answer from a member that had it
            for r in self._rejoins[conn][1].rounds:
                best = out.rounds.get(r.kind, (0, False))
                # (a topology round's answer is always "done": hearing of it is enough)
                known = r.known or r.kind == "topology"
                if r.kind in ("pending", "topology") and known and r.round > best[0]:
                    out.rounds[r.kind] = (r.round, r.answer or r.kind == "topology")
        for conn in members:
            mine = {r.kind: r for r in self._rejoins[conn][1].rounds}
            for kind, (n, _) in out.rounds.items():
                got = mine.get(kind)
                if got is not None and got.round == n - 1:
                    out.owed.setdefault(conn, []).append(kind)
                    if got.waiting:  # its vote waits: answered with the rebuild
                        out.waiting.setdefault(conn, []).append(kind)

    def _verdicts(self, members: dict[int, int], out: Outcome) -> None:
        # (group, kind, tag, seq) -> did every member reporting it finish its part?
        finished: dict[tuple[int, int, int, int], bool] = {}
        for conn, (_, r) in self._rejoins.items():
            group = members.get(conn)
            for d in r.doubts:
                if group is None:
                    continue  # a joiner's doubts are aborted below
                key = _key(group, d)
                finished[key] = finished.get(key, True) and d.done
        for conn, (_, r) in self._rejoins.items():
            group = members.get(conn)
            for d in r.doubts:
                if not d.done:
                    continue  # it failed this operation already: nothing to tell it
                ok = group is not None and finished[_key(group, d)]
                if d.kind == DOUBT_SYNC:
                    (out.synced if ok else out.sync_failed)[conn] = d.seq
                    if ok and group is not None:
                        out.revisions[group] = max(out.revisions.get(group, -1), d.seq)
                else:
                    (out.complete if ok else out.abort).setdefault(conn, []).append(
                        (d.tag, d.seq))


def _key(group: int, d: m.Doubt) -> tuple[int, int, int, int]:
    """What a doubt is about: collective (tag, seq) of the group, or the group's sync (one
    at a time; a peer that voted and had no plan yet reports it without its revision)."""
    return (group, d.kind, 0, 0) if d.kind == DOUBT_SYNC else (group, d.kind, d.tag, d.seq)
