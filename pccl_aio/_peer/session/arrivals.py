"""Waiting for company without polling: ``Communicator.wait_for_peers``.

The master tells every member when a batch of joiners becomes due for admission, and when it
stops being due (``PeersWaiting``). ``Arrivals`` keeps the last word and wakes its waiters on
it, on every new membership and when the session ends; ``wait_for_peers`` then admits the
joiners by the group's joint votes (``are_peers_pending``, ``update_topology``), the calls a
training loop makes, so it composes with peers that are in such a loop. While nobody
arrives, a waiting peer sends the master nothing but its heartbeats.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from ..._errors import MasterLostError

__all__ = ["Arrivals", "wait_for_peers"]

#: After a "no" to ``are_peers_pending`` while the master's last word was "joiners wait" (a
#: carried or re-sent answer, around a master failover), wait this long for news before
#: voting again: a bound on the votes, never a spin.
RETRY_AFTER = 1.0


class Arrivals:
    """The master's last ``PeersWaiting`` word, and the waiters for the next change."""

    __slots__ = ("_change", "waiting")

    def __init__(self) -> None:
        self.waiting = False  # a batch of joiners is due: a pending vote would say True
        self._change: asyncio.Future[None] | None = None

    def told(self, waiting: bool) -> None:
        """The master's ``PeersWaiting``."""
        self.waiting = waiting
        self.wake()

    def lost(self) -> None:
        """The master session ended: its word no longer holds (the next master re-tells)."""
        self.told(False)

    def wake(self) -> None:
        """Something a waiter looks at changed (the membership, the session, the word)."""
        fut, self._change = self._change, None
        if fut is not None and not fut.done():
            fut.set_result(None)

    async def changed(self, timeout: float | None = None) -> None:
        """Until the next ``wake`` (or ``timeout``). Cancelling only stops this wait."""
        if self._change is None:
            self._change = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(self._change)
        except TimeoutError:
            pass


async def wait_for_peers(arrivals: Arrivals, n: int, size: Callable[[], int],
                         check: Callable[[], None], pending: Callable[[], Awaitable[bool]],
                         update: Callable[[], Awaitable[None]]) -> int:
    """Until ``size()`` (the group's world size) is at least ``n``; returns it.

    Each time the master says joiners are due, every waiting member votes ``pending()`` and,
    on a yes, ``update()``, which admits them. ``check()`` raises why the session cannot go
    on. A master lost meanwhile is ridden out (``MasterLostError`` from a vote: wait on).
    Cancelling takes back a vote in flight (the votes' own rule) and ends the wait.
    """
    while size() < n:
        check()
        if not arrivals.waiting:
            await arrivals.changed()
            continue
        try:
            if await pending():
                await update()
            elif arrivals.waiting:  # the word was stale: wait for news, then vote again
                await arrivals.changed(RETRY_AFTER)
        except MasterLostError:
            continue
    return size()
