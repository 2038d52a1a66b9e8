"""This peer's tickets: the seqs the master reserved for the next collective of a tag (sans-IO).

A ``CollectiveComplete`` may carry a ticket (``next_seq``, valid for the ring of its
``epoch``): the group's next collective with that tag may then move data at once, before the
master's ``CollectiveStart``. Every peer of the group gets the same ticket; its seq is reserved
in the receive registry, so frames of it that come before this peer launched are stashed
(``stash.py``). A new membership voids every ticket, here as at the master.
"""

from __future__ import annotations

from collections.abc import Callable

from ...._wire import messages as m
from .stash import Stash


class Tickets:
    """tag -> (seq, epoch) of the tickets held; ``reserve`` marks a seq in the registry."""

    __slots__ = ("_held", "_reserve", "_stash")

    def __init__(self, stash: Stash, reserve: Callable[[int], None] | None = None) -> None:
        self._stash = stash
        self._reserve = reserve if reserve is not None else stash.reserve
        self._held: dict[int, tuple[int, int]] = {}

    def __len__(self) -> int:
        return len(self._held)

    def issued(self, msg: m.CollectiveComplete) -> None:
        """Take the verdict's ticket (if any) and drop the tickets it says were evicted."""
        for tag in msg.evicted:
            self._drop(tag)
        if msg.next_seq:
            self._drop(msg.tag)
            self._held[msg.tag] = (msg.next_seq, msg.epoch)
            self._reserve(msg.next_seq)

    def use(self, tag: int, membership: m.Membership | None) -> tuple[int, bool]:
        """The ticket of a launch of ``tag`` now, consumed: (seq, spoiled); (0, False) if
        none is held for the ring as it is. Spoiled: frames of it were dropped here
        (``Stash.spoil``), so it must not start early; the vote tells the master."""
        held = self._held.pop(tag, None)
        if held is None:
            return 0, False
        seq, epoch = held
        if membership is None or epoch != membership.epoch or len(membership.ring) < 2:
            self._stash.unreserve(seq)
            return 0, False
        if seq in self._stash.spoiled:
            self._stash.unreserve(seq)
            return seq, True
        return seq, False

    def void(self) -> None:
        """A new membership: every ticket and every frame stashed for one is void."""
        self._held.clear()
        self._stash.void()

    def _drop(self, tag: int) -> None:
        held = self._held.pop(tag, None)
        if held is not None:
            self._stash.unreserve(held[0])
