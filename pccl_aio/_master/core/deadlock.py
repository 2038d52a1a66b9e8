"""Deadlock detection, sans-IO: who waits on what, and which peers can never go on.

A peer *waits* on an item: a counted topology or pending vote (global: every accepted peer
must cast it), a counted sync or optimize vote of its group, or a collective ``(group, tag)``
it launched, *awaits* (``CollectiveWait``) and the master has not started (both: every
accepted member of the group must cast it). A peer that waits on at least one item is
*blocked*; one that is computing, or syncing and waiting for the others' ``SyncDone``, is free.

Rule (a fixpoint): start from every blocked peer; remove a peer if an item it waits on misses
nobody (it is about to complete) or misses a peer outside the set that can still cast it (a
free peer may still act). A free peer cannot cast a topology or sync vote while a collective
it launched waits for a peer in the set (the master refuses those votes next to a launch).
Repeat until nothing changes: the peers left wait forever.

``conflict`` is the older, stricter rule for ``update_topology()``, checked first at votes and
launches: the topology callers fail alone and the others wait for them to follow.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterable
from typing import Literal, Protocol, TypeAlias

from ..._text import plural
from ..._wire.messages import VOTE_CALLS

__all__ = ["GLOBAL", "HELD", "Board", "Deadlock", "Item", "conflict", "find", "scope_of"]

Kind: TypeAlias = Literal["topology", "pending", "sync", "optimize", "collective"]
#: (kind, group, tag); group and tag are 0 where the kind has none.
Item: TypeAlias = tuple[Kind, int, int]
#: Items every member must cast (the others: the members of the item's group).
GLOBAL = ("topology", "pending")
#: Items not cast while a launch of the caster's is unstarted (a launch holds them back).
HELD = ("topology", "sync", "optimize")
_LISTED = 8  # peers named in a reason; the rest are counted


class Board(Protocol):
    """What detection needs from the master's state."""

    def members(self) -> dict[int, int]:
        """Accepted peer -> its group."""

    def waits(self) -> Iterable[tuple[Item, Collection[int], Collection[int]]]:
        """(item, peers that cast it, peers that wait on it) for every counted vote and every
        collective that did not start (awaited or not); no item twice."""


@dataclasses.dataclass(frozen=True, slots=True)
class Deadlock:
    """The peers that wait forever, what each waits on, who each item misses, and which free
    peers a launch holds back (peer -> its collective that waits for a deadlocked peer)."""

    waits: dict[int, list[Item]]
    missing: dict[Item, list[int]]
    held: dict[int, Item]

    def reason(self) -> str:
        """Who waits on what, by peer id, for every rejected call's message."""
        peers = sorted(self.waits)
        parts = [f"peer {c} waits in " + " and ".join(self._call(i) for i in self.waits[c])
                 for c in peers[:_LISTED]]
        if len(peers) > _LISTED:
            parts.append(f"and {plural(len(peers) - _LISTED, 'more peer')}")
        return ("deadlock: " + "; ".join(parts)
                + "; all peers must make the same calls in the same order")

    def _call(self, item: Item) -> str:
        kind, _, tag = item
        miss = self.missing[item]
        if kind == "collective":
            return f"all_reduce(tag={tag}), which {_peers(miss)} never launched"
        held = [c for c in miss if c in self.held]
        if not held:
            return VOTE_CALLS[kind]
        return VOTE_CALLS[kind] + ", " + ", ".join(
            f"which peer {c} cannot join before its all_reduce(tag={self.held[c][2]}) starts"
            for c in held[:_LISTED])


def _peers(conns: list[int]) -> str:
    if len(conns) == 1:
        return f"peer {conns[0]}"
    more = " and more" if len(conns) > _LISTED else ""
    return "peers " + ", ".join(map(str, conns[:_LISTED])) + more


def scope_of(members: dict[int, int]) -> Callable[[Item], set[int]]:
    """Who must cast an item, given the members (peer -> group): every member for a topology
    or pending vote, the item's group for the others."""
    everyone, groups = set(members), dict[int, set[int]]()
    for c, g in members.items():
        groups.setdefault(g, set()).add(c)
    return lambda item: everyone if item[0] in GLOBAL else groups.get(item[1], set())


def find(board: Board) -> Deadlock | None:
    """The deadlocked peers on ``board``, or None. A pass is linear in the peers each item
    needs; passes repeat only while peers leave the set."""
    items = list(board.waits())
    if not any(waiters for _, _, waiters in items):
        return None
    members = board.members()
    scope = scope_of(members)
    missing: dict[Item, set[int]] = {}  # item -> required peers that have not cast it
    waits: dict[int, list[Item]] = {}
    launches: dict[int, list[Item]] = {}  # peer -> unstarted collectives it launched
    for item, cast, waiters in items:
        missing[item] = scope(item).difference(cast)
        for c in waiters:
            if c in members:
                waits.setdefault(c, []).append(item)
        if item[0] == "collective":
            for c in cast:
                if c in members:
                    launches.setdefault(c, []).append(item)
    stuck = set(waits)
    while stuck:
        held = {c: next(x for x in ls if missing[x] & stuck) for c, ls in launches.items()
                if c not in stuck and any(missing[x] & stuck for x in ls)}
        free = {c for c in stuck if any(_moves(x, missing[x], stuck, held) for x in waits[c])}
        if not free:
            break
        stuck -= free
    if not stuck:
        return None
    return Deadlock({c: waits[c] for c in sorted(stuck)},
                    {x: sorted(missing[x]) for c in stuck for x in waits[c]}, held)


def _moves(item: Item, missing: set[int], stuck: set[int], held: dict[int, Item]) -> bool:
    """``item`` misses nobody, or a peer outside ``stuck`` that can still cast it."""
    able = missing - stuck
    if item[0] in HELD:
        able.difference_update(held)
    return not missing or bool(able)


def conflict(board: Board) -> tuple[list[int], str] | None:
    """At a topology or pending vote and at a launch: topology voters next to a pending vote,
    or next to a launched, unstarted collective that needs none of them (its launchers go on
    to another phase), fail alone, at once; the others wait for them to follow. A launch that
    needs a topology voter is ``find``'s case. (the voters to withdraw, the reason), or None."""
    waits = list(board.waits())
    voters = set(next((w for (kind, _, _), _, w in waits if kind == "topology"), ()))
    if not voters:
        return None
    members = board.members()
    busy: set[int] = set()
    for (kind, group, _), cast, waiters in waits:
        if kind == "pending":
            busy.update(waiters)
        elif kind == "collective" and not any(
                members.get(c) == group and c not in cast for c in voters):
            busy.update(cast)
    if not busy:
        return None
    return sorted(voters), (
        f"peers {sorted(busy)} are in are_peers_pending() or an all-reduce while peers "
        f"{sorted(voters)} called update_topology(); all peers must make the same calls in "
        "the same order")
