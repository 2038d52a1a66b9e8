"""Members that withhold a vote, sans-IO: the one member that has not cast a vote (or
launched a collective) that every other member of its scope cast and waits on, while it
waits on nothing itself, is kicked after ``timeout`` seconds. A member waiting on something
else is the deadlock detector's (``deadlock.find``); two or more missing are not "one member
against the others" and are left to the callers' timeouts.
"""

from __future__ import annotations

from ..._wire.messages import VOTE_CALLS
from .deadlock import Board, Item, scope_of

__all__ = ["VoteTimer"]


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
        scope_for = scope_of(board.members())
        items = list(board.waits())
        waiting = {c for _, _, waiters in items for c in waiters}
        since: dict[Item, tuple[int, float]] = {}
        due: dict[int, str] = {}
        for item, cast, waiters in items:
            scope = scope_for(item)
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
