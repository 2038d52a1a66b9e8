"""The wire messages of master failover (``messages.py`` puts them in its unions).

A peer that lost its master brings the run back to the next one: ``Hello.rejoin`` says who
it was (``Rejoin``). A peer given several master addresses asks each one first (``Probe``,
answered by ``ProbeAnswer``) and registers with the one of the highest term. A master that
learns of a higher term than its own ends its sessions with ``Superseded``.
"""

from __future__ import annotations

from typing import Annotated, Final

import msgspec

from .base import Msg, Record
from .fields import U63, U64, HostName, Key, Reason

__all__ = ["MAX_DOUBTS", "MAX_RING", "Doubt", "Probe", "ProbeAnswer", "Rejoin", "Round",
           "RunId", "Superseded"]

#: Caps on what a rejoining peer can make a master hold.
MAX_RING: Final = 1 << 16
MAX_DOUBTS: Final = 1 << 12
#: A run id: printable, at most 128 characters ("" before the run has one).
RunId = Annotated[str, msgspec.Meta(max_length=128)]

DOUBT_COLLECTIVE: Final = 0
DOUBT_SYNC: Final = 1


class Doubt(Record, frozen=True):
    """An operation whose verdict was lost with the master: collective (``tag``, ``seq``)
    (``kind`` 0) or the group's sync to revision ``seq`` (``kind`` 1, ``tag`` 0). ``done``:
    this peer finished its part successfully (its result is final and only the verdict is
    missing); False: it gave up (it was failed locally when the master was lost)."""

    kind: Annotated[int, msgspec.Meta(ge=0, le=1)]
    tag: U64
    seq: U63
    done: bool


class Round(Record, frozen=True):
    """The last round of a joint vote (``kind`` "pending" or "topology") a peer saw
    answered: its number and, for "pending", the answer."""

    kind: Annotated[str, msgspec.Meta(max_length=16)]
    round: U63
    answer: bool
    known: bool = True  # False: the round was heard of (a Membership), not answered here
    waiting: bool = False  # this peer's vote of this kind waits for its answer (in doubt)


class Rejoin(Record, frozen=True):
    """Who a peer was under its previous master: its ``peer_id``, whether it was a ring
    member (``accepted``) or waiting to join, the ``term`` and ``epoch`` of the last
    ``Membership`` it saw and its group's ring then (peer ids, in order), the highest
    collective seq it saw, its shared-state ``revision`` (-1: never synced), the
    operations in doubt, and the ``seal`` of that ``Membership`` (with a master secret: a
    master that has one believes the id, term, epoch and ring only with it)."""

    peer_id: U63
    accepted: bool
    term: U63
    epoch: U63
    ring: Annotated[list[U63], msgspec.Meta(max_length=MAX_RING)]
    max_seq: U63
    revision: Annotated[int, msgspec.Meta(ge=-1, le=2**63 - 1)]
    doubts: Annotated[list[Doubt], msgspec.Meta(max_length=MAX_DOUBTS)] = []
    rounds: Annotated[list[Round], msgspec.Meta(max_length=4)] = []
    seal: Key = b""


class Probe(Msg, frozen=True, tag=14):
    """Before (or instead of) ``Hello``: which run and term does this master serve?"""


class ProbeAnswer(Msg, frozen=True, tag=82):
    """Answer to ``Probe``: the master's ``term`` (0: it serves no run yet), its ``run_id``,
    its ring members and whether it stepped down (``superseded``: a higher term exists)."""

    term: U63
    run_id: RunId
    members: U63
    superseded: bool = False


REBUILT_WITHOUT = "the run was rebuilt without this peer: it joins again as a new member"


class Superseded(Msg, frozen=True, tag=83):
    """This master learned of a master of a higher ``term`` and stepped down: the session
    ends, and the peer rejoins the run where it is now served. Also (``reason``
    ``REBUILT_WITHOUT``) to a peer that rejoined a restarted master as a member and is none
    in the run rebuilt there: it joins that master again, as a new member."""

    term: U63
    reason: Reason = ""
    where: HostName = ""
