"""The life cycle of one collective on one peer: one ``Phase`` and its legal moves (sans-IO).

``VOTING``: the vote went out, no start yet. ``EARLY``: data moves on a ticket, before the
master's start. ``EARLY_DONE``: that data finished here, the master's start not seen yet.
``RUNNING``: the master started it and data moves. ``DATA_DONE``: its data finished here (the
result is final in ``dst``); only the verdict is missing. ``ENDED``: the verdict came (or the
master was lost); the future holds the outcome.

The master's start moves ``EARLY`` to ``RUNNING`` and ``EARLY_DONE`` to ``DATA_DONE`` when it
confirms the ticket's seq; when it found the ticket void, the early attempt is dropped and a
fresh one starts (``EARLY``/``EARLY_DONE`` -> ``RUNNING``). Any phase may end; nothing leaves
``ENDED``. Being cancelled by the caller is not a phase: the verdict still comes. ``move``
refuses any other move, so a bug shows where it happens, not as wrong bytes later.
"""

from __future__ import annotations

import enum
from typing import Final


class Phase(enum.Enum):
    """Where one collective is in its life cycle."""

    # Members are singletons: hash by identity, in C (``Enum.__hash__`` is a Python call,
    # and every move looks the phase up in ``MOVES`` and the sets below).
    __hash__ = object.__hash__

    VOTING = "voting"
    EARLY = "early"
    EARLY_DONE = "early, data done"
    RUNNING = "running"
    DATA_DONE = "data done"
    ENDED = "ended"


MOVES: Final[dict[Phase, frozenset[Phase]]] = {
    Phase.VOTING: frozenset({Phase.EARLY, Phase.RUNNING, Phase.ENDED}),
    Phase.EARLY: frozenset({Phase.RUNNING, Phase.EARLY_DONE, Phase.ENDED}),
    Phase.EARLY_DONE: frozenset({Phase.DATA_DONE, Phase.RUNNING, Phase.ENDED}),
    Phase.RUNNING: frozenset({Phase.DATA_DONE, Phase.ENDED}),
    Phase.DATA_DONE: frozenset({Phase.ENDED}),
    Phase.ENDED: frozenset(),
}

STARTED: Final = frozenset({Phase.EARLY, Phase.EARLY_DONE, Phase.RUNNING, Phase.DATA_DONE})
EARLY: Final = frozenset({Phase.EARLY, Phase.EARLY_DONE})  # the master's start not seen yet
DONE: Final = frozenset({Phase.EARLY_DONE, Phase.DATA_DONE})  # the data finished here


class IllegalMove(RuntimeError):
    """A move the life cycle does not allow (a bug of the caller)."""


def move(now: Phase, to: Phase) -> Phase:
    """``to``, if the life cycle allows ``now`` -> ``to``; else raises ``IllegalMove``."""
    if to not in MOVES[now]:
        raise IllegalMove(f"a collective cannot go from {now.name} to {to.name}")
    return to


def confirmed(now: Phase) -> Phase:
    """The phase after the master's start confirmed an early attempt (the same seq)."""
    if now not in EARLY:
        raise IllegalMove(f"a collective in {now.name} is not an early attempt to confirm")
    return move(now, Phase.DATA_DONE if now is Phase.EARLY_DONE else Phase.RUNNING)


def finished(now: Phase) -> Phase:
    """The phase after the run task finished the data here."""
    if now not in (Phase.EARLY, Phase.RUNNING):
        raise IllegalMove(f"a collective in {now.name} has no data moving to finish")
    return move(now, Phase.EARLY_DONE if now is Phase.EARLY else Phase.DATA_DONE)
