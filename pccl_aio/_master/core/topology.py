"""``optimize_topology()`` on the master, sans-IO: link measurements and each group's ring.

Rules: a group's optimize starts when every accepted member voted ``VoteOptimize``. The
ordered pairs of members without a measurement are measured in rounds; in a round every peer
sends to at most one peer and receives from at most one (``MeasurePlan`` to each sender; the
round ends when every sender answered ``MeasureReport``). A round older than the measurement
time plus ``ROUND_GRACE`` kicks its silent senders. Then ``tour.solve`` orders the ring by
seconds per byte (an unmeasurable pair, 0 bits/s, is never a neighbour while a ring avoids
it; if none does, every voter gets ``VoteRejected`` and the ring stays), the master bumps the
epoch, sends the new ``Membership`` and then ``TopologyOptimized`` to the voters: the one
agreed switch point. A ring within ``KEEP_WITHIN`` of the best stays as it is. Beyond
``tour.EXACT_MAX`` peers the solve is a bounded local search (``SOLVE_BUDGET``); it goes on
in the background, ``TICK_BUDGET`` evaluations per ``Tick``, and the next call (the next
agreed switch point) takes the better ring it found, measuring nothing new.

The matrix (``links``) survives runs and churn: a departed peer's entries are dropped, so
after churn only the pairs of new peers are measured. A ring keeps its order; new members
are appended in join order. A member that withdraws its vote during the measurement aborts
the optimize for the others (the measurements so far are kept); one that departs is dropped
from it. Reports are checked: only the pairs of the current round, once each.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Final, Protocol

from ..._errors import RemoteProtocolError
from ..._wire import messages as m
from . import tour
from .events import Action, Send

__all__ = ["MEASURE_SECONDS", "MEASURE_STREAMS", "ROUND_GRACE", "Topology"]

MEASURE_SECONDS: Final = 0.5  # of pushing bytes, per measured pair
MEASURE_STREAMS: Final = 4  # connections per measured pair
ROUND_GRACE: Final = 15.0  # connect, pings, a window stretched to 5 s, report: beyond it
KEEP_WITHIN: Final = 1.05  # a ring whose bottleneck is within 5 % of the best is kept
SOLVE_BUDGET: Final = 10_000  # ring evaluations at a switch (256 peers: ~0.25 s here)
TICK_BUDGET: Final = 1_000  # ... per Tick afterwards, while they improve the ring

Pair = tuple[int, int]


class Roster(Protocol):
    """What the optimizer needs from the master's state."""

    def accepted(self, group: int | None = None) -> list[int]:
        """Accepted peers of ``group``, ascending."""

    def addr(self, conn: int) -> m.PeerAddr:
        """Where peer ``conn`` listens."""

    def kick(self, conn: int, reason: str, out: list[Action]) -> None:
        """End ``conn``'s session (a protocol violation) and treat it as departed."""

    def publish(self, out: list[Action]) -> int:
        """Bump the epoch and send every accepted peer its ``Membership``; the new epoch."""


@dataclasses.dataclass(slots=True)
class _Run:
    """One group's optimize after every member voted."""

    voters: list[int]
    todo: list[Pair]  # pairs not yet scheduled
    round: int = 0
    asked: set[Pair] = dataclasses.field(default_factory=set)  # current round, unanswered
    started: float = 0.0
    measured: int = 0
    gone: set[int] = dataclasses.field(default_factory=set)


class Topology:
    """Votes, measurement rounds, the link matrix and the ring order of every group."""

    def __init__(self, roster: Roster, seconds: float = MEASURE_SECONDS,
                 streams: int = MEASURE_STREAMS) -> None:
        self._roster = roster
        self.seconds, self.streams = seconds, streams
        self.links: dict[Pair, tuple[float, float]] = {}  # (src, dst) -> (bits/s, latency s)
        self._votes: dict[int, int] = {}  # conn -> group: counted votes of groups not running
        self._runs: dict[int, _Run] = {}  # group -> its running optimize
        self._rings: dict[int, list[int]] = {}  # group -> ring order
        self._round = 0  # the last round id issued
        self._better: dict[int, list[int]] = {}  # group -> best ring found in the background
        self._settled: set[int] = set()  # groups whose ``_better`` no move improves

    # ---- queries ----------------------------------------------------------------------------
    def voters(self) -> dict[int, list[int]]:
        """group -> peers whose vote is counted and waits for the others'."""
        out: dict[int, list[int]] = {}
        for c, g in self._votes.items():
            out.setdefault(g, []).append(c)
        return out

    def voted(self, conn: int) -> bool:
        """``conn``'s optimize vote is counted (it waits for the others')."""
        return conn in self._votes

    def voted_any(self) -> bool:
        """Some optimize vote is counted."""
        return bool(self._votes)

    def busy(self, conn: int) -> bool:
        """``conn`` voted, or takes part in a running optimize."""
        return conn in self._votes or any(conn in r.voters for r in self._runs.values())

    def order(self, group: int, members: list[int]) -> list[int]:
        """The ring of ``group``'s ``members``: its kept order, then new members ascending."""
        now = set(members)
        kept = [c for c in self._rings.get(group, ()) if c in now]
        known = set(kept)
        ring = kept + sorted(c for c in members if c not in known)
        self._rings[group] = ring
        return ring

    def restore(self, group: int, ring: list[int]) -> None:
        """A rebuilt run: the group's ring order as its peers knew it."""
        self._rings[group] = list(ring)

    # ---- events -------------------------------------------------------------------------------
    def vote(self, conn: int, group: int, now: float, out: list[Action]) -> None:
        """Count ``conn``'s vote; starts the group's measurement once every member voted."""
        if self.busy(conn):
            raise RemoteProtocolError("duplicate optimize_topology vote")
        self._votes[conn] = group
        self.check(group, now, out)

    def reject(self, conn: int) -> None:
        """Forget ``conn``'s counted vote (the caller answers it)."""
        self._votes.pop(conn, None)

    def withdraw(self, conn: int, group: int, out: list[Action]) -> None:
        """``conn`` gave up: forget its vote; a running optimize ends for the other voters."""
        if self._votes.pop(conn, None) is not None:
            return
        run = self._runs.get(group)
        if run is None or conn not in run.voters:
            return
        del self._runs[group]
        reason = (f"peer {conn} gave up during the measurement; the links measured so far "
                  "are kept")
        out.extend(Send(c, m.VoteRejected("optimize", reason)) for c in run.voters if c != conn)

    def report(self, conn: int, group: int, msg: m.MeasureReport, now: float,
               out: list[Action]) -> None:
        """Record a measurement; the round ends when every sender of it answered. Raises
        ``RemoteProtocolError`` for a report nobody asked for (or twice)."""
        run = self._runs.get(group)
        if msg.round == 0 or msg.round > self._round:
            raise RemoteProtocolError(f"measurement report of round {msg.round}, never issued")
        if run is None or msg.round != run.round:
            return  # a round of an optimize that ended (withdrawn, or a peer departed)
        pair = (conn, msg.to)
        if pair not in run.asked:
            if msg.to in run.gone:
                return
            raise RemoteProtocolError(
                f"measurement report for link {conn}->{msg.to}, which round {msg.round} did "
                "not ask this peer to measure (or twice)")
        run.asked.discard(pair)
        if not (math.isfinite(msg.bits_per_s) and math.isfinite(msg.latency)):
            raise RemoteProtocolError("measurement report with a non-finite value")
        self.links[pair] = (msg.bits_per_s, msg.latency)
        run.measured += 1
        if not run.asked:
            self._next_round(group, run, now, out)

    def drop(self, conn: int, group: int) -> None:
        """Forget a departed peer: its vote, its links, its place in rings and runs (then
        ``check`` its group)."""
        self._votes.pop(conn, None)
        for pair in [p for p in self.links if conn in p]:
            del self.links[pair]
        run = self._runs.get(group)
        if run is not None and conn in run.voters:
            run.voters.remove(conn)
            run.gone.add(conn)
            run.asked = {p for p in run.asked if conn not in p}
            run.todo = [p for p in run.todo if conn not in p]

    def check(self, group: int, now: float, out: list[Action]) -> None:
        """Start the group's optimize if every member voted; go on with a running one whose
        round lost its last unanswered sender."""
        run = self._runs.get(group)
        if run is not None:
            if not run.asked:
                self._next_round(group, run, now, out)
            return
        members = self._roster.accepted(group)
        if not members or any(self._votes.get(c) != group for c in members):
            return
        for c in members:
            del self._votes[c]
        ring = self.order(group, members)
        todo = [(a, b) for a in ring for b in ring if a != b and (a, b) not in self.links]
        pos = {c: i for i, c in enumerate(ring)}
        todo.sort(key=lambda p: ((pos[p[1]] - pos[p[0]]) % len(ring), pos[p[0]]))  # by shift
        run = self._runs[group] = _Run(list(ring), todo)
        self._next_round(group, run, now, out)

    def tick(self, now: float, out: list[Action]) -> None:
        """Kick the senders of rounds that overran their time (they never reported); go on
        improving large groups' rings (``TICK_BUDGET``)."""
        for group, ring in list(self._better.items()):
            if group in self._runs or sorted(ring) != self._roster.accepted(group):
                del self._better[group]  # measuring, or churn: the next call starts afresh
                continue
            if group in self._settled:
                continue
            cost = self._matrix(ring)
            start = list(range(len(ring)))
            found = tour.improve(cost, start, TICK_BUDGET)
            if tour.ring_cost(cost, found) < tour.ring_cost(cost, start):
                self._better[group] = [ring[i] for i in found]
            else:
                self._settled.add(group)  # a local optimum: nothing more to find
        late = []
        for run in self._runs.values():
            if run.asked and now - run.started > self.seconds + ROUND_GRACE:
                late.extend(sorted({src for src, _ in run.asked}))
        for c in late:
            if c in self._roster.accepted():
                self._roster.kick(c, f"no measurement report within "
                                  f"{self.seconds + ROUND_GRACE:g} s", out)

    # ---- rounds -------------------------------------------------------------------------------
    def _next_round(self, group: int, run: _Run, now: float, out: list[Action]) -> None:
        senders: set[int] = set()
        receivers: set[int] = set()
        chosen: list[Pair] = []
        rest: list[Pair] = []
        for src, dst in run.todo:
            if src in senders or dst in receivers:
                rest.append((src, dst))
            else:
                senders.add(src)
                receivers.add(dst)
                chosen.append((src, dst))
        if not chosen:
            self._finish(group, run, out)
            return
        self._round += 1
        run.todo, run.asked, run.round, run.started = rest, set(chosen), self._round, now
        out.extend(Send(src, m.MeasurePlan(self._round, self._roster.addr(dst), self.seconds,
                                           self.streams)) for src, dst in chosen)

    def _finish(self, group: int, run: _Run, out: list[Action]) -> None:
        del self._runs[group]
        members = self.order(group, self._roster.accepted(group))
        cost = self._matrix(members)
        pos = {c: i for i, c in enumerate(members)}
        found = [tour.solve(cost, SOLVE_BUDGET)]
        if sorted(self._better.get(group, ())) == sorted(members):
            found.append([pos[c] for c in self._better[group]])
        picked = min(found, key=lambda r: tour.ring_cost(cost, r))
        best = [members[i] for i in picked]
        new, old = tour.ring_cost(cost, picked), tour.ring_cost(cost, list(range(len(members))))
        if len(members) > 1 and math.isinf(new[0]):
            cut = sorted(p for p in self.links if self.links[p][0] == 0.0
                         and p[0] in members and p[1] in members)
            reason = (f"no ring of the group avoids the links that could not be measured "
                      f"({_pairs(cut)}); the ring stays")
            out.extend(Send(c, m.VoteRejected("optimize", reason)) for c in run.voters)
            return
        if old[0] > new[0] * KEEP_WITHIN:
            self._rings[group] = members = best
        self._settled.discard(group)
        if len(members) > tour.EXACT_MAX:
            self._better[group] = list(members)  # improved on Ticks from here
        epoch = self._roster.publish(out)
        n = len(members)
        slowest = min((self.links[(members[k], members[(k + 1) % n])][0] for k in range(n)),
                      default=0.0) if n > 1 else 0.0
        answer = m.TopologyOptimized(epoch, list(members), run.measured, slowest)
        out.extend(Send(c, answer) for c in run.voters)

    def _matrix(self, ring: list[int]) -> list[list[float]]:
        return [[self._cost(a, b) for b in ring] for a in ring]

    def _cost(self, a: int, b: int) -> float:
        """Seconds per byte from ``a`` to ``b`` (inf: unreachable or never measured)."""
        if a == b:
            return 0.0
        bps = self.links.get((a, b), (0.0, 0.0))[0]
        return 8.0 / bps if bps > 0 else math.inf


def _pairs(pairs: list[Pair]) -> str:
    shown = ", ".join(f"{a}->{b}" for a, b in pairs[:8])
    return shown + (f" and {len(pairs) - 8} more" if len(pairs) > 8 else "")
