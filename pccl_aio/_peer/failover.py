"""Riding out a lost master (the peer's side of failover; ``_master/core/failover.py`` is the
master's).

When the master session ends without a goodbye, the communicator keeps its state, its peer
links and its shared state, and:

- fails the votes in flight and the collectives that had not finished their data with
  ``MasterLostError`` (an in-place input is restored first): retry means relaunch;
- keeps the collectives (and a sync) that finished their part on this peer *in doubt*: only
  the verdict is missing, and the next master gives it (``_master/core/recovery.py``);
- reconnects with back-off (50 ms doubling to 0.5 s) to its master address, or the best of
  several (``session.py``), until ``master_timeout`` after the loss, and rejoins with who it
  was (``Rejoin``); calls made meanwhile wait for the rejoined run (or their ``timeout``);
- after ``master_timeout`` fails everything with ``MasterConnectionError``, as before.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from .._errors import (
    MasterConnectionError,
    MasterLostError,
    PcclError,
    VersionMismatchError,
)
from .._wire import messages as m
from .._wire.recovery import DOUBT_COLLECTIVE, DOUBT_SYNC
from .collective import Collective
from .session import open_session

if TYPE_CHECKING:
    from .control import ControlPlane

__all__ = ["Outage"]

log = logging.getLogger("pccl_aio.communicator")

_FIRST_DELAY, _MAX_DELAY = 0.05, 0.5  # s between reconnection attempts: back-off, not a sync
_ROUNDS = ("pending", "topology")  # joint votes kept in doubt through an outage


class Outage:
    """One communicator's master outages: the collectives launched meanwhile (``deferred``),
    the ones failed at the loss (reported to the next master) and the reconnection task."""

    def __init__(self) -> None:
        self.deferred: list[Collective] = []
        self.failed: list[m.Doubt] = []
        self.since: float | None = None  # loop time of the loss; None: not in an outage
        self.count = 0  # outages ridden out so far
        self.seconds = 0.0  # their time, the outage now excepted (metrics)
        self.demoted = False  # the master stepped down: rejoin as a joiner, not a member
        self.as_joiner = False  # this rejoin is as a joiner: calls made meanwhile are void
        self.joined = 0  # rejoins as a joiner so far (a vote waiting across one fails)
        self._task: asyncio.Task[None] | None = None

    def begin(self, cp: ControlPlane, why: PcclError) -> None:
        """The session ended: fail what cannot be finished, start reconnecting."""
        loop = asyncio.get_running_loop()
        if self.since is None:
            self.since = loop.time()
            self.count += 1
            log.warning("peer %d: master %s lost (%s); rejoining the run for up to %g s",
                        cp.peer_id, cp.master, why, cp.config.master_timeout,
                        extra=cp.ids(master=cp.master, term=cp.term, cause=str(why)))
        if cp._up is None or cp._up.done():
            cp._up = loop.create_future()
        lost = MasterLostError(f"the master was lost ({why}); retry: this peer rejoins the run")
        keep = not self.demoted  # (a superseded peer's run gave way: nothing of it is in doubt)
        reported = keep and cp.sync is not None and cp.sync[1] is True
        if "sync" in cp._votes:  # voted, no plan yet: the group's sync cannot complete
            self.failed.append(m.Doubt(DOUBT_SYNC, 0, 0, False))
        for kind, fut in list(cp._votes.items()):
            if keep and ((kind == "sync_done" and reported)  # the next master decides
                         or (kind in _ROUNDS and kind not in cp._withdrawing)):
                continue  # in doubt: answered by the next master if a member had the answer
            del cp._votes[kind]
            if not fut.done():
                fut.set_exception(lost)
                fut.exception()  # retrieved: a sync mid-fetch raises from its SyncDone
        cp._withdrawing.clear()
        if cp.sync is not None and not reported:
            self.failed.append(m.Doubt(DOUBT_SYNC, 0, cp.sync[0], False))
            cp.sync = None
        for coll in list(cp.colls.values()):
            if keep and coll.seq and coll.data_ok and not coll.cancelled:
                continue  # in doubt
            if coll in self.deferred:
                continue  # not launched yet: it goes out to the next master
            if coll.seq:
                self.failed.append(m.Doubt(DOUBT_COLLECTIVE, coll.tag, coll.seq, False))
            coll.on_lost(lost)
        if self._task is None or self._task.done():
            self._task = cp._tasks.spawn(self._ride(cp), name="pccl_aio master failover")

    def rejoin(self, cp: ControlPlane) -> m.Rejoin:
        """Who this peer was, for the next master's ``Hello``."""
        doubts = list(self.failed)
        for coll in list(cp.colls.values()):
            if not coll.seq or coll in self.deferred:
                continue
            if coll.data_ok and not coll.cancelled:
                doubts.append(m.Doubt(DOUBT_COLLECTIVE, coll.tag, coll.seq, True))
            else:  # given up meanwhile: it fails here, and for the group
                doubts.append(m.Doubt(DOUBT_COLLECTIVE, coll.tag, coll.seq, False))
                coll.on_lost(MasterLostError("cancelled while the master was lost"))
        if cp.sync is not None:
            doubts.append(m.Doubt(DOUBT_SYNC, 0, cp.sync[0], bool(cp.sync[1])))
        ms = cp.membership
        ring = [p.peer_id for p in ms.ring] if ms is not None else []
        member = cp.peer_id in ring
        return m.Rejoin(cp.peer_id, member, ms.term if ms else cp.term,
                        ms.epoch if ms else 0, ring,
                        cp.registry.max_seq if cp.registry is not None else 0,
                        cp.revision, doubts,
                        _rounds(cp))

    def end(self, cp: ControlPlane) -> None:
        """The run is rejoined (a ``Membership`` came): send what was launched meanwhile."""
        if self.since is not None:
            took = asyncio.get_running_loop().time() - self.since
            self.seconds += took
            log.warning("peer %d: rejoined the run at %s (term %d) after %.2f s", cp.peer_id,
                        cp.master, cp.term, took,
                        extra=cp.ids(master=cp.master, term=cp.term, seconds=round(took, 3)))
        self.since = None
        self.failed = []
        self.demoted = False
        lost = MasterLostError("the master was lost before this vote was answered: call again")
        for kind in _ROUNDS:  # votes in doubt that the next master did not answer
            fut = cp._votes.pop(kind, None)
            if fut is not None and not fut.done():
                fut.set_exception(lost)
        if self.as_joiner:  # admitted anew: what was launched meanwhile belongs to before
            self.joined += 1
            void = MasterLostError("launched before this peer rejoined the run as a new "
                                   "member: launch it again")
            for coll in self.deferred:
                coll.on_lost(void)
            self.deferred = []
        cp.relaunch()

    async def _ride(self, cp: ControlPlane) -> None:
        loop = asyncio.get_running_loop()
        assert self.since is not None
        end = self.since + cp.config.master_timeout
        delay = _FIRST_DELAY
        while cp.failure is None:
            try:
                session = await open_session(cp.config, cp._hello_now(), cp.term)
            except VersionMismatchError as exc:
                cp.fail_all(exc)
                return
            except (OSError, TimeoutError) as exc:
                # Nobody answers yet, or a master dies or starts mid-handshake (the handshake
                # then reads as refused: AuthenticationError is retried too, until the end).
                left = end - loop.time()
                if left <= 0:
                    cp.fail_all(MasterConnectionError(
                        f"no master for {cp.config.master_timeout:g} s (master_timeout): "
                        f"{exc}"))
                    return
                await asyncio.sleep(min(delay, left))  # back-off, not a synchronisation
                delay = min(delay * 2, _MAX_DELAY)
                continue
            cp._begin(session)
            return


def _rounds(cp: ControlPlane) -> list[m.Round]:
    """The last joint-vote round of each kind this peer saw answered, or heard of in a
    ``Membership`` (then ``known`` False: it had joined after that round)."""
    out = []
    for kind in _ROUNDS:
        n, answer = cp.rounds.get(kind, (0, False))
        heard, waiting = cp.heard.get(kind, 0), kind in cp._votes
        if heard > n:
            out.append(m.Round(kind, heard, False, False, waiting))
        elif n or waiting:
            out.append(m.Round(kind, n, answer, True, waiting))
    return out
