"""Deadlock detection, sans-IO: who waits on what, and which peers can never go on.

A peer *waits* on an item: a counted topology or pending vote (global: every accepted peer
must cast it), a counted sync vote of its group, or a collective ``(group, tag)`` it launched,
*awaits* (``CollectiveWait``) and the master has not started (both: every accepted member of
the group must cast it). A peer that waits on at least one item is *blocked*; one that is
computing, or syncing and waiting for the others' ``SyncDone``, is free.

Rule (a fixpoint): start from every blocked peer; remove a peer if an item it waits on still
misses a required peer outside the set (a free peer may still act) or misses nobody (it is
about to complete); repeat until nothing changes. The peers left wait forever.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable
from typing import Literal, Protocol, TypeAlias

__all__ = ["Board", "Deadlock", "Item", "conflict", "find"]

Kind: TypeAlias = Literal["topology", "pending", "sync", "collective"]
#: (kind, group, tag); group and tag are 0 where the kind has none.
Item: TypeAlias = tuple[Kind, int, int]
_GLOBAL = ("topology", "pending")
_CALLS = {"topology": "update_topology()", "pending": "are_peers_pending()",
          "sync": "sync_shared_state()"}
_LISTED = 8  # peers named in a reason; the rest are counted


class Board(Protocol):
    """What detection needs from the master's state."""

    def members(self) -> dict[int, int]:
        """Accepted peer -> its group."""

    def waits(self) -> Iterable[tuple[Item, Collection[int], Collection[int]]]:
        """(item, peers that cast it, peers that wait on it) for every counted vote and every
        collective that did not start (awaited or not)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Deadlock:
    """The peers that wait forever, what each waits on, and who each item misses."""

    waits: dict[int, list[Item]]
    missing: dict[Item, list[int]]

    def reason(self) -> str:
        """Who waits on what, by peer id, for every rejected call's message."""
        peers = sorted(self.waits)
        parts = [f"peer {c} waits in " + " and ".join(self._call(i) for i in self.waits[c])
                 for c in peers[:_LISTED]]
        if len(peers) > _LISTED:
            parts.append(f"and {len(peers) - _LISTED} more peers")
        return "deadlock: " + "; ".join(parts)

    def _call(self, item: Item) -> str:
        kind, _, tag = item
        if kind != "collective":
            return _CALLS[kind]
        miss = self.missing[item]
        who = (f"peer {miss[0]}" if len(miss) == 1 else "peers " + ", ".join(
            map(str, miss[:_LISTED])) + (" and more" if len(miss) > _LISTED else ""))
        return f"all_reduce(tag={tag}), which {who} never launched"


def find(board: Board) -> Deadlock | None:
    """The deadlocked peers on ``board``, or None. One pass is O(peers + items + votes)."""
    entries = [(item, voters, list(waiters)) for item, voters, waiters in board.waits()
               if waiters]
    if not entries:
        return None
    members = board.members()
    size: dict[int, int] = {}  # group -> accepted members
    for g in members.values():
        size[g] = size.get(g, 0) + 1
    scope = [len(members) if item[0] in _GLOBAL else size.get(item[1], 0)
             for item, _, _ in entries]
    cast = [[v for v in voters if v in members and (item[0] in _GLOBAL or members[v] == item[1])]
            for item, voters, _ in entries]
    by_peer: dict[int, list[int]] = {}
    for i, (_, _, waiters) in enumerate(entries):
        for c in waiters:
            if c in members:
                by_peer.setdefault(c, []).append(i)
    stuck = set(by_peer)
    free_all = len(members) - len(stuck)
    free_in = dict(size)  # group -> members outside ``stuck``
    for c in stuck:
        free_in[members[c]] -= 1
    free_cast = [sum(v not in stuck for v in vs) for vs in cast]
    voted_in: dict[int, list[int]] = {}
    for i, vs in enumerate(cast):
        for v in vs:
            voted_in.setdefault(v, []).append(i)

    def moves(i: int) -> bool:
        """Item ``i`` misses nobody, or someone who is free."""
        item = entries[i][0]
        free = free_all if item[0] in _GLOBAL else free_in.get(item[1], 0)
        return len(cast[i]) == scope[i] or free > free_cast[i]

    changed = True
    while changed and stuck:
        changed = False
        for c in sorted(stuck):
            if any(moves(i) for i in by_peer[c]):
                stuck.discard(c)
                free_all += 1
                free_in[members[c]] += 1
                for i in voted_in.get(c, ()):
                    free_cast[i] += 1
                changed = True
    if not stuck:
        return None
    waits = {c: [entries[i][0] for i in by_peer[c]] for c in sorted(stuck)}
    missing: dict[Item, list[int]] = {}
    for i, (item, voters, _) in enumerate(entries):
        if any(c in stuck for c in entries[i][2]):
            voted = set(voters)
            missing[item] = sorted(c for c, g in members.items() if c not in voted and (
                item[0] in _GLOBAL or g == item[1]))
    return Deadlock(waits, missing)


def conflict(board: Board) -> tuple[list[int], str] | None:
    """Topology voters next to peers in ``are_peers_pending()`` or with a collective launched
    that did not start: the peers disagree on what to call next (``update_topology`` needs
    every peer idle; a launcher cannot vote for it before its collective ends). Checked at
    every vote and launch, before ``find``: the topology callers fail at once, whoever else
    is free, and the others wait for them to follow. (the voters to withdraw, reason) or None."""
    voters: list[int] = []
    busy: set[int] = set()
    for (kind, _, _), cast, waiters in board.waits():
        if kind == "topology":
            voters = sorted(waiters)
        elif kind == "pending":
            busy.update(waiters)
        elif kind == "collective":
            busy.update(cast)
    if not voters or not busy:
        return None
    return voters, (f"peers {sorted(busy)} are in are_peers_pending() or an all-reduce while "
                    f"peers {voters} called update_topology(); all peers must make the same "
                    "calls in the same order")
