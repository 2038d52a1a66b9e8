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
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import msgspec

from ..._errors import MasterConnectionError, MasterLostError, PcclError, VersionMismatchError
from ..._net.tasks import TaskSet
from ..._wire import messages as m
from ..._wire.recovery import DOUBT_COLLECTIVE
from ..core.config import PeerConfig
from ..data.collective import Collective
from ..data.receiver import Registry
from .core.votes import Settle, VoteBook, Withdraw
from .dial import Session, open_session

__all__ = ["Outage", "Plane"]

log = logging.getLogger("pccl_aio.communicator")

_FIRST_DELAY, _MAX_DELAY = 0.05, 0.5  # s between reconnection attempts: back-off, not a sync


class Plane(Protocol):
    """The control plane as an outage sees it (``control.ControlPlane``)."""

    @property
    def config(self) -> PeerConfig: ...

    @property
    def peer_id(self) -> int: ...

    @property
    def term(self) -> int: ...

    @property
    def run_id(self) -> str: ...

    @property
    def master(self) -> str: ...

    @property
    def membership(self) -> m.Membership | None: ...

    @property
    def registry(self) -> Registry: ...

    @property
    def colls(self) -> Mapping[int, Collective]: ...

    @property
    def votes(self) -> VoteBook[Any]: ...

    @property
    def failure(self) -> PcclError | None: ...

    def ids(self, **fields: Any) -> dict[str, dict[str, Any]]: ...

    def settle(self, actions: Iterable[Settle[Any] | Withdraw], retrieve: bool = False
               ) -> None:
        """Do what the vote book answered (complete futures, take votes back)."""

    def send_launch(self, coll: Collective) -> None:
        """Send a collective's vote and start it early on its ticket (raises if it cannot)."""

    def fail_all(self, exc: PcclError) -> None:
        """The session ended for good: everything waiting fails with ``exc``."""

    def begin(self, session: Session) -> None:
        """A registered session: its reader and heartbeat tasks."""


class Outage:
    """One communicator's master outages: the collectives launched meanwhile (``deferred``),
    the ones failed at the loss (reported to the next master), this peer's registration
    (``hello``, sent to every master with its ``Rejoin``) and the reconnection task (one of
    ``tasks``)."""

    def __init__(self, tasks: TaskSet) -> None:
        self.hello: m.Hello | None = None  # this peer's registration, without rejoin data
        self.deferred: list[Collective] = []
        self.failed: list[m.Doubt] = []
        self.since: float | None = None  # loop time of the loss; None: not in an outage
        self.count = 0  # outages ridden out so far
        self.seconds = 0.0  # their time, the outage now excepted (metrics)
        self.demoted = False  # the master stepped down: rejoin as a joiner, not a member
        self.as_joiner = False  # this rejoin is as a joiner: calls made meanwhile are void
        self.joined = 0  # rejoins as a joiner so far (a vote waiting across one fails)
        self._tasks = tasks
        self._task: asyncio.Task[None] | None = None

    def hello_now(self, cp: Plane) -> m.Hello:
        """This peer's ``Hello`` as of now: with its ``Rejoin`` once it had a master."""
        assert self.hello is not None
        # a peer whose master stepped down joins afresh: its id may be another's there
        rejoin = self.rejoin(cp) if cp.peer_id and not self.demoted else None
        run_id = cp.config.run_id or cp.run_id
        return msgspec.structs.replace(self.hello, run_id=run_id, term=cp.term, rejoin=rejoin)

    def begin(self, cp: Plane, why: PcclError) -> None:
        """The session ended: fail what cannot be finished, start reconnecting (calls now
        wait for the run rejoined)."""
        loop = asyncio.get_running_loop()
        if self.since is None:
            self.since = loop.time()
            self.count += 1
            log.warning("peer %d: master %s lost (%s); rejoining the run for up to %g s",
                        cp.peer_id, cp.master, why, cp.config.master_timeout,
                        extra=cp.ids(master=cp.master, term=cp.term, cause=str(why)))
        keep = not self.demoted  # (a superseded peer's run gave way: nothing of it is in doubt)
        lost = MasterLostError(f"the master was lost ({why}); retry: this peer rejoins the run"
                               + ("" if keep else " as a new member"), new_member=not keep)
        settled, doubts = cp.votes.in_doubt(keep, lost)
        self.failed += doubts
        cp.settle(settled, retrieve=True)  # retrieved: a sync mid-fetch raises from SyncDone
        for coll in list(cp.colls.values()):
            if keep and coll.seq and coll.data_ok and not coll.cancelled:
                continue  # in doubt
            if coll in self.deferred:
                continue  # not launched yet: it goes out to the next master
            if coll.seq:
                self.failed.append(m.Doubt(DOUBT_COLLECTIVE, coll.tag, coll.seq, False))
            coll.on_lost(lost)
        if self._task is None or self._task.done():
            self._task = self._tasks.spawn(self._ride(cp), name="pccl_aio master failover")

    def rejoin(self, cp: Plane) -> m.Rejoin:
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
        doubts += cp.votes.sync_doubt()
        ms = cp.membership
        ring = [p.peer_id for p in ms.ring] if ms is not None else []
        # (a peer that rejoined as a joiner and lost that master too is a joiner still: its
        # last ring is from before, and claiming it made a rebuild take it back as a member)
        member = cp.peer_id in ring and not self.as_joiner
        return m.Rejoin(cp.peer_id, member, ms.term if ms else cp.term,
                        ms.epoch if ms else 0, ring,
                        cp.registry.max_seq,
                        cp.votes.revision, doubts, cp.votes.rounds(),
                        ms.seal if ms is not None and member else b"")

    def end(self, cp: Plane) -> None:
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
        lost = MasterLostError("the master was lost before this vote was answered" + (
            ", and this peer rejoined the run as a new member" if self.as_joiner else
            ": call again"), new_member=self.as_joiner)
        cp.settle(cp.votes.rejoined(lost))  # votes in doubt that the next master did not answer
        if self.as_joiner:  # admitted anew: what was launched meanwhile belongs to before
            self.joined += 1
            void = MasterLostError("launched before this peer rejoined the run as a new "
                                   "member", new_member=True)
            for coll in self.deferred:
                coll.on_lost(void)
            self.deferred = []
            self.as_joiner = False  # a member again
        deferred, self.deferred = self.deferred, []
        for coll in deferred:  # their votes go out now
            if coll.future.done():
                continue
            try:
                cp.send_launch(coll)
            except PcclError as exc:
                coll.on_lost(exc)

    async def _ride(self, cp: Plane) -> None:
        loop = asyncio.get_running_loop()
        assert self.since is not None
        end = self.since + cp.config.master_timeout
        delay = _FIRST_DELAY
        while cp.failure is None:
            try:
                session = await open_session(cp.config, self.hello_now(cp), cp.term)
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
            cp.begin(session)
            return
