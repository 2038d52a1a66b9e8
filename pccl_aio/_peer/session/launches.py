"""The collective launches of a ``ControlPlane`` (a base class of it): a collective's vote,
its early start on a ticket, the caller's wait and the reports of its data.

A collective with nothing to move (a barrier) started on a ticket reports its data done
during its launch; ``batched`` writes the vote, the wait and that report together, so the
master reads them as one batch. Nothing here blocks or awaits.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..._errors import PcclError
from ..._wire import messages as m
from ..data.collective import Collective
from ..data.core.tickets import Tickets
from .failover import Outage

__all__ = ["Launches"]


class Launches:
    """Launching collectives; ``ControlPlane`` sets the parts."""

    peer_id: int
    membership: m.Membership | None
    colls: dict[int, Collective]
    failure: PcclError | None
    tickets: Tickets
    outage: Outage
    _batch: list[bytes] | None

    @property
    def up(self) -> bool:
        raise NotImplementedError

    def send(self, *msgs: m.PeerToMaster) -> None:
        raise NotImplementedError

    def _flush(self, data: bytes) -> None:
        raise NotImplementedError

    @contextlib.contextmanager
    def batched(self) -> Iterator[None]:
        """``send``s inside are written at its end, in one write (if the session holds)."""
        self._batch = batch = list[bytes]()
        try:
            yield
        finally:
            self._batch = None
            if batch:
                self._flush(b"".join(batch))

    def launch(self, coll: Collective, awaited: bool = False) -> None:
        """Send the collective's vote (``CollectiveInit``) and track it until its verdict;
        ``awaited``: the caller waits on it at once (``CollectiveWait`` in the same write, so
        the master never sees the vote without the wait). With a ticket of the ring as it is
        (``Tickets``) its data starts moving here and now, before the master's start."""
        if self.failure is not None:
            raise self.failure
        self.colls[coll.tag] = coll
        coll.hooks.append(self._forget)
        coll.awaited = awaited
        if not self.up:  # no master now: the vote goes out once the run is rejoined
            coll.save_input()
            self.outage.deferred.append(coll)
            return
        self.send_launch(coll, save=True)

    def send_launch(self, coll: Collective, save: bool = False) -> None:
        """Send the vote of ``coll`` (tracked in ``colls``; ``save``: then back its input
        up, overlapping the master's round trip) and start it early on its ticket. Raises
        why it cannot be sent (``coll`` is dropped from ``colls`` then)."""
        d, q, (seq, spoiled) = coll.dst, coll.quant, self.tickets.use(coll.tag, self.membership)
        init = m.CollectiveInit(coll.tag, coll.count, int(d.dtype), int(coll.op),
                                int(q.algo) if q else 0, int(q.dtype) if q else 0, seq, spoiled,
                                int(coll.kind), coll.spec.root, coll.spec.epoch, coll.awaited)
        with self.batched():
            try:
                self.send(init)
            except BaseException:
                self.colls.pop(coll.tag, None)
                raise
            coll.ticket = seq = seq if not spoiled else 0
            if save:
                coll.save_input()
            if seq and self.membership is not None:
                coll.on_start(seq, [p.peer_id for p in self.membership.ring], self.peer_id,
                              early=True)

    def awaiting(self, coll: Collective) -> None:
        """The caller now waits on ``coll``: if the master has not started it, say so once
        (``CollectiveWait``), so that it can tell a blocked peer from a computing one."""
        if not coll.awaited and not coll.confirmed and not coll.future.done():
            coll.awaited = True
            with contextlib.suppress(PcclError):
                self.send(m.CollectiveWait(coll.tag))

    def _forget(self, coll: Collective) -> None:
        if self.colls.get(coll.tag) is coll:
            del self.colls[coll.tag]

    def report(self, tag: int, seq: int, ok: bool, reason: str, suspect: int = 0,
               stalled: bool = False) -> None:
        """``CollectiveDone`` for (tag, seq); dropped if the session is over."""
        with contextlib.suppress(PcclError):
            self.send(m.CollectiveDone(tag, seq, ok, reason[:200], suspect, stalled))
