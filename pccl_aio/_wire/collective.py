"""The wire messages of a collective (``messages.py`` puts them in its unions).

A peer votes for a collective with ``CollectiveInit`` (and says with ``CollectiveWait`` that
its caller now waits on it); the master answers with ``CollectiveStart`` once the group agrees,
or ``CollectiveRejected``. Each participant reports ``CollectiveDone``; every voter then gets
exactly one terminal message, ``CollectiveComplete`` or ``CollectiveAbort``. The rules that span
fields (``CollectiveInit``'s quantization) are checked at decode by ``messages._check``.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from .._types import CollectiveKind
from .base import Msg
from .fields import MAX_EVICTED, U32, U63, U64, Algo, DType, Kind, Op, QDType, Reason

__all__ = ["CollectiveAbort", "CollectiveComplete", "CollectiveDone", "CollectiveInit",
           "CollectiveRejected", "CollectiveStart", "CollectiveWait"]


# ---- peer -> master ------------------------------------------------------------------------
class CollectiveInit(Msg, frozen=True, tag=5):
    """Vote to start the collective ``tag`` in this peer's group with this descriptor;
    ``quant_dtype`` is uint8, uint16 or (MIN_MAX only) uint4 when quantized, 0 when
    ``quant_algo`` is NONE. ``seq``: the ticket (``CollectiveComplete.next_seq``) this peer
    already runs the collective as, before its ``CollectiveStart``; or, with ``spoiled``, a
    ticket it had to drop frames of (the master then starts it with a fresh seq); else 0.
    ``kind``: a ``CollectiveKind`` (a barrier: count 0; all-gather and reduce-scatter: the
    count per rank), ``root``: a broadcast's root rank (else 0), part of the descriptor.
    ``epoch``: the membership epoch a ranked kind (broadcast, all-gather, reduce-scatter) was
    launched in (else 0): the master aborts it if the group's ring changed since.
    ``awaited``: the launcher already waits on it (a ``CollectiveWait`` in the same message)."""

    tag: U64
    count: U64
    dtype: DType
    op: Op
    quant_algo: Algo = 0
    quant_dtype: QDType = 0
    seq: U63 = 0
    spoiled: bool = False
    kind: Kind = 0
    root: U32 = 0
    epoch: U63 = 0
    awaited: bool = False


class CollectiveDone(Msg, frozen=True, tag=6):
    """This peer finished its part of collective (tag, seq); ``ok`` False reports a failure,
    ``suspect`` the peer whose data connection broke, if that is why (else 0); ``stalled``:
    the suspect, this peer's predecessor (or, in log2 P rounds, round 0's sender), sent
    nothing of the attempt within the data timeout (the master kicks it)."""

    tag: U64
    seq: U63
    ok: bool
    reason: Reason = ""
    suspect: U63 = 0
    stalled: bool = False


class CollectiveWait(Msg, frozen=True, tag=11):
    """The caller now waits on collective ``tag``, which this peer launched (``CollectiveInit``)
    and the master has not started yet; sent at most once per attempt. Lets the master tell a
    peer that is blocked from one that is computing (deadlock detection)."""

    tag: U64


# ---- master -> peer ------------------------------------------------------------------------
class CollectiveStart(Msg, frozen=True, tag=69):
    """All group peers voted for ``tag`` with one descriptor: run it as ``seq`` on ring
    ``epoch``."""

    tag: U64
    seq: U63
    epoch: U63


class CollectiveComplete(Msg, frozen=True, tag=70):
    """Every participant reported success: the result of (tag, seq) stands. ``next_seq``
    (else 0) is a ticket: the group's next collective ``tag`` may start moving data at once as
    ``next_seq`` while this peer's ring is still the one of ``epoch`` (any membership change
    voids it; the master then starts it with a fresh seq, which the early starters follow).
    ``evicted``: tags whose tickets the master dropped (too many held), void from now on."""

    tag: U64
    seq: U63
    next_seq: U63 = 0
    epoch: U63 = 0
    evicted: Annotated[list[U63], msgspec.Meta(max_length=MAX_EVICTED)] = []


class CollectiveAbort(Msg, frozen=True, tag=71):
    """Collective ``tag`` (``seq`` 0 if it never started) was aborted; the caller may retry."""

    tag: U64
    seq: U63
    reason: str


class CollectiveRejected(Msg, frozen=True, tag=72):
    """The group's peers disagreed on the descriptor of ``tag``, or (``deadlock``) it could
    never start because the peers wait on each other; nothing ran."""

    tag: U64
    reason: str
    deadlock: bool = False


def kind_error(msg: CollectiveInit) -> str:
    """What a ``CollectiveInit``'s kind forbids (``messages._check`` calls it at decode): a
    root but for a broadcast, an op or a quantization where nothing is reduced, data in a
    barrier, an epoch where ranks do not matter (or none where they do)."""
    kind = CollectiveKind(msg.kind)
    where = f"CollectiveInit ({kind.label})"
    reduces = kind in (CollectiveKind.ALL_REDUCE, CollectiveKind.REDUCE_SCATTER)
    if msg.root and kind != CollectiveKind.BROADCAST:
        return f"{where}.root: {msg.root} (must be 0)"
    if not reduces and (msg.op or msg.quant_algo):
        return f"{where}: op {msg.op} / quantization {msg.quant_algo} (nothing is reduced)"
    if kind == CollectiveKind.BARRIER and msg.count:
        return f"{where}.count: {msg.count} (a barrier moves no data)"
    if kind.ranked != bool(msg.epoch):
        return f"{where}.epoch: {msg.epoch} ({'0' if msg.epoch else 'the launch epoch'} due)"
    return ""
