"""Members that withhold a vote, sans-IO: the one member that has not cast a vote (or
launched a collective) that every other member of its scope cast and waits on, while it
waits on nothing itself, is kicked after ``timeout`` seconds. A member waiting on something
else is the deadlock detector's (``deadlock.find``); two or more missing are not "one member
against the others" and are left to the callers' timeouts.
"""

from __future__ import annotations

from ..._wire.messages import VOTE_CALLS
from .deadlock import Board, Item

__all__ = ["VoteTimer"]

_GLOBAL = ("topology", "pending")


class VoteTimer:
    """When each lone holdout began holding out (``check``, at each master tick)."""

    def __init__(self, timeout: float | None) -> None:
        """``timeout``: seconds a lone holdout is tolerated; None: never kicked."""
        self.timeout = timeout
        self._since: dict[Item, tuple[int, float]] = {}  # item -> (holdout, since)

    def check(self, board: Board, now: float) -> list[tuple[int, str]]:
        """(member, reason) for every holdout whose time is up, each member once. Linear in
        the items' voters; nothing without a timeout."""
        if self.timeout is None:
            return []
        members = board.members()
        items = list(board.waits())
        waiting = {c for _, _, waiters in items for c in waiters}
        groups: dict[int, set[int]] = {}
        for c, g in members.items():
            groups.setdefault(g, set()).add(c)
        since: dict[Item, tuple[int, float]] = {}
        due: dict[int, str] = {}
        for item, cast, waiters in items:
            scope = set(members) if item[0] in _GLOBAL else groups.get(item[1], set())
            missing = scope.difference(cast)
            if len(scope) < 2 or len(missing) != 1 or not waiters:
                continue
            (holdout,) = missing
            if holdout in waiting:
                continue
            c, t = self._since.get(item, (holdout, now))
            since[item] = (holdout, t if c == holdout else now)
            if now - since[item][1] >= self.timeout:
                due.setdefault(holdout, _reason(item, self.timeout))
                del since[item]
        self._since = since
        return list(due.items())


def _reason(item: Item, timeout: float) -> str:
    kind, _, tag = item
    call = f"all_reduce(tag={tag})" if kind == "collective" else VOTE_CALLS[kind]
    return (f"withheld {call} for {timeout:g} s while every other member waited in it "
            f"(Master(vote_timeout=))")
