"""The incremental deadlock rule, sans-IO: after an event, is a deadlock possible at all?

``deadlock.find`` is linear in the peers; run after every message it made the master's cost
per message grow with the run. This module keeps, for every item that peers wait on, a
*witness*: a member in the item's scope that has not cast it, waits on nothing (is free) and,
for an item a launch holds back (topology, sync, optimize), launched no collective that has
not started. An item with a witness cannot be part of a deadlock: its waiters leave ``find``'s
set in its first pass (the witness can still cast it). So while every item with waiters has a
witness, ``find`` would answer None and is not run.

A witness stops being one only through its own doing (it casts the item, starts waiting,
launches) or its departure, and an item gains waiters only through theirs: after an event the
items to check again are those witnessed by, or waited on by, the peers the event touched,
plus those left without a witness. A scan for a witness walks the item's scope from a cursor
that passes the members that cast it: in lock step each member is passed once per item, O(1)
per message. Events that may change many peers at once (a tick, a rebuilt run) check every
item. An item left without a witness is checked at every event, and ``find`` runs then.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Protocol

from .deadlock import GLOBAL, Item

__all__ = ["Ledger", "Quiet"]


class Ledger(Protocol):
    """What the rule reads of the master's state; each answer O(1) (O(tags) for a peer)."""

    def roster(self, group: int | None = None) -> tuple[int, ...]:
        """The members (of ``group``), ascending; the same object until membership changes."""

    def waited(self, conn: int) -> list[Item]:
        """The items member ``conn`` waits on."""

    def witness(self, item: Item, conn: int) -> bool:
        """``conn`` is a member in ``item``'s scope that has not cast it, waits on nothing
        and, for a topology, sync or optimize vote, launched no collective that has not
        started."""

    def cast(self, item: Item, conn: int) -> bool:
        """``conn`` cast ``item`` (voted it, launched it)."""

    def maybe_waited(self, item: Item) -> bool:
        """False only if nobody waits on ``item``."""

    def items(self) -> Iterable[Item]:
        """Every item with waiters (linear in the peers: for ``Quiet.everything``)."""


@dataclasses.dataclass(slots=True)
class _Watch:
    members: tuple[int, ...]  # the scope the cursor walks
    cursor: int = 0  # members before it cast the item
    witness: int | None = None


class Quiet:
    """Witnesses of the items peers wait on; ``settled`` says whether ``find`` may be skipped.
    ``steps`` counts the peers examined (the rule's work), ``finds`` the full checks left."""

    def __init__(self) -> None:
        self._touched: set[int] = set()
        self._all = True
        self._watch: dict[Item, _Watch] = {}
        self._by: dict[int, set[Item]] = {}  # witness -> items it witnesses
        self._open: set[Item] = set()  # items with waiters and no witness
        self.steps = 0
        self.finds = 0

    def touch(self, conn: int) -> None:
        """``conn`` sent a message, or departed: its items are checked again."""
        self._touched.add(conn)

    def everything(self) -> None:
        """Check every item at the next ``settled`` (after a tick or a rebuilt run)."""
        self._all = True

    def settled(self, ledger: Ledger) -> bool:
        """True when every item with waiters has a witness (no deadlock); else the caller
        runs ``find`` (counted in ``finds``)."""
        if self._all or self._open or len(self._touched) > 1:
            todo = set(self._open)
            if self._all:
                self._all = False
                todo.update(ledger.items())
                todo.update(self._watch)
            for c in self._touched:
                todo.update(self._by.pop(c, ()))
                todo.update(ledger.waited(c))
            self._touched.clear()
        elif self._touched:  # (one peer's message: most often nothing to check)
            c = self._touched.pop()
            witnessed, waited = self._by.pop(c, None), ledger.waited(c)
            if not (witnessed or waited):
                return True
            todo = {*(witnessed or ()), *waited}
        else:
            return True
        for item in todo:
            self._check(ledger, item)
        if self._open:
            self.finds += 1
        return not self._open

    def _check(self, ledger: Ledger, item: Item) -> None:
        if not ledger.maybe_waited(item):
            self._watch.pop(item, None)
            self._open.discard(item)
            return
        members = ledger.roster(None if item[0] in GLOBAL else item[1])
        watch = self._watch.get(item)
        if watch is None or watch.members is not members:
            watch = self._watch[item] = _Watch(members, witness=watch.witness if watch else None)
        w = watch.witness
        if w is None or not self._valid(ledger, item, w):
            w = self._scan(ledger, item, watch)
            if w is None and watch.cursor:  # a withdrawn vote, or a new round: from the top
                watch.cursor = 0
                w = self._scan(ledger, item, watch)
        watch.witness = w
        if w is None:
            self._open.add(item)
        else:
            self._by.setdefault(w, set()).add(item)
            self._open.discard(item)

    def _scan(self, ledger: Ledger, item: Item, watch: _Watch) -> int | None:
        members, i = watch.members, watch.cursor
        while i < len(members) and ledger.cast(item, members[i]):
            i += 1
            self.steps += 1
        watch.cursor = i
        for c in members[i:]:
            self.steps += 1
            if self._valid(ledger, item, c):
                return c
        return None

    def _valid(self, ledger: Ledger, item: Item, conn: int) -> bool:
        self.steps += 1
        return ledger.witness(item, conn)
