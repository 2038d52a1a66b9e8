"""The peer's side of the control plane: master connection, heartbeats, votes, dispatch.

One reader task per session dispatches master messages *synchronously and in order*
(votes' answers, membership, collective verdicts); one heartbeat task keeps both sides'
liveness. When the master session ends without a goodbye, ``failover.Outage`` rides it out
(``MasterLostError`` for what was waiting, a rejoin for up to ``master_timeout``); when it
ends for good (kicked, closed, ``master_timeout`` passed) every waiting call, and every later
one, fails with ``MasterConnectionError`` (or ``KickedError``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from typing import Any

from ... import _log
from ..._errors import (
    InvalidUsageError,
    KickedError,
    MasterConnectionError,
    MasterLostError,
    PcclError,
    RemoteProtocolError,
)
from ..._net.stream import read_frame
from ..._net.tasks import TaskSet
from ..._wire import messages as m
from ..._wire.fields import VoteKind
from ..._wire.framing import frame
from ..core.config import PeerConfig
from ..data.collective import Collective
from ..data.core.tickets import Tickets
from ..data.receiver import Registry
from .arrivals import Arrivals
from .core.votes import Settle, VoteBook, Withdraw
from .dial import Session, close_quietly, goodbye, heartbeat, open_retrying
from .dispatch import dispatch
from .failover import Outage
from .launches import Launches

log = logging.getLogger("pccl_aio.communicator")


class ControlPlane(Launches):
    """The master session of one communicator.

    Owns the master connection, its two tasks, the futures of the votes waiting for an
    answer (their state is the ``VoteBook``'s, ``votes``) and the collectives in flight by tag
    (whose verdicts it delivers in the master's order). ``on_membership`` is called with each
    new ``Membership`` before anything that follows it.
    """

    def __init__(self, config: PeerConfig, on_membership: Callable[[m.Membership], None],
                 registry: Registry, on_measure: Callable[[m.MeasurePlan], None]) -> None:
        self.config = config
        self.peer_id = 0
        self.membership: m.Membership | None = None
        self.colls: dict[int, Collective] = {}  # tag -> collective in flight
        self.failure: PcclError | None = None  # why the session ended; raised by later calls
        self._on_membership = on_membership
        self.votes: VoteBook[asyncio.Future[Any]] = VoteBook()
        self._session: Session | None = None  # the last master session, until ``close``
        self._up: asyncio.Future[None] | None = None  # done: a member of a live session
        self._gen = 0  # the live session's number (a task of an older one stops)
        self._closing = False
        self._tasks = TaskSet("pccl_aio control plane")
        self.tickets = Tickets(registry.stash, registry.reserve)  # seqs reserved in registry
        self.registry = registry  # the data plane's receive table
        self.on_measure = on_measure  # the master's measurement plans
        self.term, self.run_id = 0, ""  # the master's, as last heard
        self.outage = Outage(self._tasks)
        self.arrivals = Arrivals()  # the master's word on joiners (``wait_for_peers``)
        self._batch: list[bytes] | None = None  # ``send``s held for one write

    @property
    def connected(self) -> bool:
        """``connect`` registered a master session and ``close`` did not end it."""
        return self._session is not None

    @property
    def session(self) -> bytes:
        """The master session's key (unwraps pair keys); empty without one."""
        return self._session.key if self._session is not None else b""

    @property
    def master(self) -> str:
        """The address of the master of the last session."""
        return self._session.where if self._session is not None else ""

    @property
    def writer(self) -> asyncio.StreamWriter | None:  # the last session's (None: none)
        return self._session.writer if self._session is not None else None

    @property
    def peer_group_world_size(self) -> int:
        """Peers of this peer's ring as of the last membership update."""
        return len(self.membership.ring) if self.membership else 0

    def ids(self, **fields: Any) -> dict[str, dict[str, Any]]:
        """``extra=`` for a log line of this peer: its run, peer and group ids and
        ``fields`` (``_log.ids``)."""
        return _log.ids(self.run_id, self.peer_id, self.config.peer_group, **fields)

    # ---- session --------------------------------------------------------------------------
    async def connect(self, hello: m.Hello, attempts: int, backoff: float) -> None:
        """Open the master session, say ``hello`` and wait until accepted into the run.

        Retries ``attempts`` times with exponential back-off while no master answers; each
        step of an attempt is bounded by the heartbeat timeout. Raises
        ``MasterConnectionError`` (``VersionMismatchError``, ``AuthenticationError`` for a
        refused or failed handshake or TLS), ``PcclTimeoutError`` for a master that accepts
        and never answers. A master lost while waiting for admission is ridden out like any
        other (``master_timeout``). Cancelling leaves the connection for ``close``.
        """
        self.failure = None
        self._closing = False
        self.votes.restart()
        self.outage.hello = hello
        self._up = asyncio.get_running_loop().create_future()
        self.begin(await open_retrying(self.config, self.outage.hello_now(self), self.term,
                                       attempts, backoff))
        await self.wait_up()  # first Membership: accepted into the run

    def begin(self, session: Session) -> None:
        """A registered session: its reader and heartbeat tasks (the first ``Membership``
        completes ``wait_up``)."""
        w = session.welcome
        self.peer_id, self._session = w.peer_id, session
        self.term = max(self.term, w.term)
        self.run_id = w.run_id or self.run_id
        self.outage.as_joiner = self.outage.since is not None and not (w.accepted or w.rebuild)
        self._gen += 1
        session.heard = asyncio.get_running_loop().time()
        self._tasks.spawn(self._read_loop(session, self._gen), name="pccl_aio master reader")
        self._tasks.spawn(self._heartbeat_loop(session, self._gen), name="pccl_aio heartbeat")

    async def wait_up(self) -> None:
        """Until this peer is a member (or waits as one) of a live master session; raises
        why the session ended for good. Cancelling only stops this wait."""
        if self._up is None:
            raise InvalidUsageError("not connected: call connect() first")
        await asyncio.shield(self._up)

    @property
    def up(self) -> bool:
        """A master session is live and has accepted this peer."""
        u = self._up
        return u is not None and u.done() and not u.cancelled() and u.exception() is None

    def leave(self) -> None:
        """Say goodbye to the master (best effort) and fail everything still waiting."""
        self._closing = True
        if (session := self._session) is not None and not session.writer.is_closing():
            with contextlib.suppress(Exception):
                session.writer.write(frame(m.encode(m.Leave())))
                session.left = True
        self.fail_all(MasterConnectionError("communicator closed"))

    def abort(self) -> None:
        """Drop the master connection at once (no goodbye), as a killed process would."""
        self._closing = True
        if (writer := self.writer) is not None:
            writer.transport.abort()

    async def close(self) -> None:
        """Stop the tasks; close the master connection (after ``goodbye``). Idempotent."""
        self._closing = True
        await self._tasks.close()
        await goodbye(self._session)
        close_quietly(writer := self.writer)
        if writer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1.0)
            self._session = None

    def check_usable(self) -> None:
        """Raise why the session ended, or InvalidUsageError before ``connect``."""
        if self.failure is not None:
            raise self.failure
        if not self.connected:
            raise InvalidUsageError("not connected: call connect() first")

    def send(self, *msgs: m.PeerToMaster) -> None:
        """Frame ``msgs`` and write them together (one write: the master reads them as one
        batch). Raises why the session ended, or ``MasterLostError`` while the master is
        being replaced."""
        if self.failure is None and self.up and (self.writer is None or self.writer.is_closing()):
            # broken before the read loop saw it: the outage starts now, so that a caller
            # that retries at once waits for the next master (it spun here, loop starved)
            self._lost(MasterConnectionError("the master connection broke"), self._gen)
        if self.failure is not None:
            raise self.failure
        if not self.up or self.writer is None or self.writer.is_closing():
            raise MasterLostError("the master is lost; this peer is rejoining the run",
                                  new_member=self.outage.demoted)
        data = b"".join(frame(m.encode(msg)) for msg in msgs)
        if self._batch is not None:  # (``batched``: written together at its end)
            self._batch.append(data)
        else:
            self.writer.write(data)

    def _flush(self, data: bytes) -> None:
        if (writer := self.writer) is not None and not writer.is_closing():
            writer.write(data)

    def fail_all(self, exc: PcclError) -> None:
        """The session ended for good: every vote, the join, every collective (and every
        launch waiting for a master) fails with ``exc``."""
        if self.failure is None:
            self.failure = exc
        self.settle(self.votes.fail(exc), retrieve=True)  # (a waiter may be gone)
        self.arrivals.wake()
        if self._up is not None and not self._up.done():
            self._up.set_exception(exc)
            self._up.exception()  # retrieved: waiters re-raise it
        for coll in list(self.colls.values()):
            coll.on_lost(exc)
        self.colls.clear()
        self.outage.deferred.clear()

    def _lost(self, exc: PcclError, gen: int) -> None:
        """Session ``gen`` ended without a goodbye: ride the outage out (``failover``), or
        fail for good (kicked, closing, ``master_timeout`` 0)."""
        if gen != self._gen or self.failure is not None:
            return
        self._gen += 1  # the session's tasks see it ended
        self.arrivals.lost()
        close_quietly(self.writer)
        if (self._closing or isinstance(exc, KickedError) or self.config.master_timeout <= 0
                or self.outage.hello is None):
            self.fail_all(exc)
            return
        if self._up is None or self._up.done():  # calls wait for the next master
            self._up = asyncio.get_running_loop().create_future()
        self.outage.begin(self, exc)

    def admitted(self, msg: m.Membership) -> None:
        """A ``Membership`` (``dispatch``): the communicator's turn, then the first one of
        a session completes ``wait_up`` and ends the outage."""
        self._on_membership(msg)
        if self._up is not None and not self._up.done():
            self._up.set_result(None)
            self.outage.end(self)
        self.arrivals.wake()

    # ---- votes and collectives ------------------------------------------------------------
    async def vote(self, kind: VoteKind, msg: m.PeerToMaster) -> Any:
        """Send a vote and wait for its answer (a master lost meanwhile: first for the run
        rejoined). Cancelling a vote takes it back (``WithdrawVote``), so the master no
        longer counts it.

        A withdrawal can lose the race against the other peers' votes: the round then
        completed with the withdrawn vote, and the others went on. Its answer (arriving before
        the master's ``VoteWithdrawn``) is carried to this peer's next vote of that kind
        (topology, pending, optimize: the group's calls stay in step), which then returns it
        without a new round; a sync that counted a withdrawn vote fails for the group instead
        (``core/votes.py``).
        """
        carried = self.votes.open(kind)
        if carried is not None:
            return carried.value
        if not self.up:
            joined = self.outage.joined
            await self.wait_up()  # a master is being found: the vote goes to the next one
            if self.outage.joined != joined:
                raise MasterLostError(f"{m.VOTE_CALLS[kind]} was made before this peer "
                                      "rejoined the run as a new member", new_member=True)
        fut = self.expect(kind)
        try:
            self.send(msg)
        except BaseException:
            self.votes.abandon(kind, fut)
            raise
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        try:
            return await fut
        except asyncio.CancelledError:
            if self.votes.abandon(kind, fut):
                self._withdraw(kind)
            raise
        finally:
            self.votes.waited(loop.time() - t0)

    def _withdraw(self, kind: VoteKind) -> None:
        with contextlib.suppress(PcclError):
            self.send(m.WithdrawVote(kind))
            self.votes.withdraw(kind)

    def expect(self, kind: VoteKind) -> asyncio.Future[Any]:
        """A future for the master's answer to the vote of ``kind`` about to be sent. Raises
        ``InvalidUsageError`` while one waits."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.votes.cast(kind, fut)
        return fut

    def verdict(self) -> asyncio.Future[Any]:
        """A future for the group's verdict on the sync whose plan came (its second stage:
        ``SyncComplete``, or ``SharedStateError`` from ``SyncFailed``)."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.votes.await_verdict(fut)
        return fut

    def settle(self, actions: Iterable[Settle[asyncio.Future[Any]] | Withdraw],
               retrieve: bool = False) -> None:
        """Do what the vote book answered: complete futures, take votes back.
        ``retrieve``: mark the errors retrieved (their callers may be gone)."""
        for act in actions:
            if isinstance(act, Withdraw):
                self._withdraw(act.kind)
            elif act.waiter.done():
                continue
            elif act.error is None:
                act.waiter.set_result(act.value)
            else:
                act.waiter.set_exception(act.error)
                if retrieve:
                    act.waiter.exception()

    def report_measure(self, msg: m.MeasureReport) -> None:
        """A link measurement to the master; dropped if the session is over."""
        with contextlib.suppress(PcclError):
            self.send(msg)

    def report_sync(self, ok: bool, reason: str) -> None:
        """``SyncDone``: this peer's part of the sync finished (``ok``) or failed. Raises
        why it cannot be sent (``MasterLostError`` while the master is being replaced).
        Nothing goes out for a sync the master's loss already failed (its verdict holds the
        error): the next master knows no such sync."""
        if self.votes.sync is None:
            return
        self.votes.reported(ok)
        self.send(m.SyncDone(ok, reason))

    # ---- tasks ----------------------------------------------------------------------------
    async def _heartbeat_loop(self, session: Session, gen: int) -> None:
        if await heartbeat(session, self.config, lambda: gen == self._gen):
            self._lost(MasterConnectionError(
                f"master silent for more than {self.config.heartbeat_timeout:.1f} s"), gen)

    async def _read_loop(self, session: Session, gen: int) -> None:
        loop = asyncio.get_running_loop()
        exc: PcclError = MasterConnectionError("master closed the connection")
        try:
            while gen == self._gen:
                msg = m.decode_master_to_peer(await read_frame(session.reader))
                session.heard = loop.time()
                if (end := dispatch(self, msg)) is not None:  # kicked, or superseded
                    exc = end
                    break
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        except RemoteProtocolError as e:
            exc = MasterConnectionError(f"master broke the protocol: {e}")
        log.info("peer %d: %s", self.peer_id, exc, extra=self.ids(cause=str(exc)))
        self._lost(exc, gen)
