"""The run's joint votes, sans-IO (an object ``MasterState`` holds): ``update_topology()``
(``VoteUpdateTopology``) and ``are_peers_pending()`` (``VotePeersPending``).

Rules: a joint vote completes when every accepted peer (all groups) cast it. A topology round
admits every joiner (a new epoch if it admitted any: a round that admits nobody changes no
ring), then answers ``TopologyUpdated``; a pending round answers whether a batch of joiners
is due (``limits.Admission.batch_due``). Rounds are numbered; the ``Membership`` carries the last
of each, so that a rebuilt run (``failover.py``) knows which answers a member missed.
"""

from __future__ import annotations

from typing import Literal, Protocol

from ..._wire import messages as m
from .deadlock import Board, conflict
from .events import Action, Send
from .records import Peer

__all__ = ["JointVotes", "Kind", "Roster"]

Kind = Literal["pending", "topology"]


class Roster(Board, Protocol):
    """What the joint votes need from the master's state (``Board``: to find conflicts)."""

    @property
    def epoch(self) -> int:
        """The master's current epoch (membership version)."""

    def accepted(self, group: int | None = None) -> list[int]:
        """Accepted peers (of ``group``), ascending."""

    def roster(self, group: int | None = None) -> tuple[int, ...]:
        """``accepted`` as a tuple."""

    def peer(self, conn: int) -> Peer | None:
        """The peer of connection ``conn``, if it is still there."""

    def admit(self) -> list[int]:
        """Accept every joiner as a member; returns them."""

    def publish(self, out: list[Action]) -> int:
        """A new epoch, its ``Membership`` to every member; returns the epoch."""

    def batch_due(self) -> bool:
        """The answer of a pending round completed now (``limits.Admission.batch_due``)."""


class JointVotes:
    """The counted votes (``Peer.voted_topology``, ``Peer.voted_pending``) and the rounds."""

    def __init__(self, roster: Roster) -> None:
        self._roster = roster
        self.rounds: dict[Kind, int] = {"pending": 0, "topology": 0}  # answered so far
        self.voters: dict[Kind, set[int]] = {"pending": set(), "topology": set()}  # the flags'

    def vote(self, peer: Peer, kind: Kind, out: list[Action]) -> None:
        """Count ``peer``'s vote of ``kind`` (the caller checked that it may vote); reject
        conflicting topology votes (``conflict``); complete the round if it is the last."""
        if kind == "topology":
            peer.voted_topology = True
        else:
            peer.voted_pending = True
        self.voters[kind].add(peer.conn)
        self.conflict(out)
        self.check(out, kind)

    def conflict(self, out: list[Action]) -> None:
        """Withdraw the topology votes next to another phase (``deadlock.conflict``)."""
        clash = conflict(self._roster) if self.voters["topology"] else None
        if clash is not None:
            voters, reason = clash
            for c in voters:
                peer = self._roster.peer(c)
                if peer is not None:
                    self.withdraw(peer, "topology")
                out.append(Send(c, m.VoteRejected("topology", reason)))

    def withdraw(self, peer: Peer, kind: Kind) -> None:
        """Take back ``peer``'s vote of ``kind``, if counted."""
        if kind == "topology":
            peer.voted_topology = False
        else:
            peer.voted_pending = False
        self.voters[kind].discard(peer.conn)

    def forget(self, conn: int) -> None:
        """``conn`` departed: its votes no longer count."""
        for voters in self.voters.values():
            voters.discard(conn)

    def floor(self, rounds: dict[str, tuple[int, bool]]) -> None:
        """Number the next rounds above those of a rebuilt run (``recovery.Outcome.rounds``)."""
        for kind, n in self.rounds.items():
            self.rounds[kind] = max(n, rounds.get(kind, (0, False))[0])

    def check(self, out: list[Action], kind: Kind | None = None) -> None:
        """Complete the round of ``kind`` (None: of both) if every member voted."""
        if kind != "pending":
            self._check_topology(out)
        if kind != "topology":
            self._check_pending(out)

    def _voters(self, kind: Kind) -> list[Peer] | None:
        """The members, if every one of them voted ``kind``."""
        if len(self.voters[kind]) < len(self._roster.roster()):  # (voters are members)
            return None
        peers = [self._roster.peer(c) for c in self._roster.accepted()]
        voters = [p for p in peers if p is not None]
        voted = [p.voted_topology if kind == "topology" else p.voted_pending for p in voters]
        return voters if voters and all(voted) else None

    def _check_topology(self, out: list[Action]) -> None:
        voters = self._voters("topology")
        if voters is None:
            return
        joiners = self._roster.admit()
        for p in voters:
            self.withdraw(p, "topology")
        self.rounds["topology"] += 1  # (before the Membership, which tells it: a voter
        if joiners:                   # that gets it and not the answer knows it is done)
            self._roster.publish(out)
        done = m.TopologyUpdated(self._roster.epoch, self.rounds["topology"])
        out.extend(Send(p.conn, done) for p in voters)

    def _check_pending(self, out: list[Action]) -> None:
        voters = self._voters("pending")
        if voters is None:
            return
        self.rounds["pending"] += 1
        answer = m.PeersPendingAnswer(self._roster.batch_due(), self.rounds["pending"])
        for p in voters:
            self.withdraw(p, "pending")
            out.append(Send(p.conn, answer))
