"""The peer's side of the control plane: master connection, heartbeats, votes, dispatch.

One reader task per session dispatches master messages *synchronously and in order*
(votes' answers, membership, collective verdicts); one heartbeat task keeps both sides'
liveness. When the master session ends without a goodbye, ``failover.Outage`` rides it out
(``MasterLostError`` for what was waiting, a new session with a rejoin, for up to
``master_timeout``); when it ends for good (kicked, closed, ``master_timeout`` passed) every
waiting call fails with ``MasterConnectionError`` (or ``KickedError``) and every later call
raises the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import msgspec

from .. import _log
from .._errors import (
    AuthenticationError,
    InvalidUsageError,
    KickedError,
    MasterConnectionError,
    MasterLostError,
    PcclError,
    PcclTimeoutError,
    RemoteProtocolError,
    VersionMismatchError,
)
from .._net.stream import read_frame
from .._net.tasks import TaskSet
from .._wire import messages as m
from .._wire.framing import frame
from .arrivals import Arrivals
from .collective import Collective
from .core.config import PeerConfig
from .core.stash import Stash
from .core.tickets import Tickets
from .dispatch import dispatch
from .failover import Outage
from .receiver import Registry
from .session import Session, close_quietly, open_session

log = logging.getLogger("pccl_aio.communicator")

_WITHDRAWABLE = ("topology", "pending", "sync", "optimize")  # votes a cancelled caller takes back


class ControlPlane:
    """The master session of one communicator.

    Owns the master connection, its two tasks, the votes waiting for an answer and the
    collectives in flight by tag (whose verdicts it delivers in the master's order).
    ``on_membership`` is called with each new ``Membership`` before anything that follows it.
    """

    def __init__(self, config: PeerConfig,
                 on_membership: Callable[[m.Membership], None]) -> None:
        self.config = config
        self.peer_id = 0
        self.membership: m.Membership | None = None
        self.colls: dict[int, Collective] = {}  # tag -> collective in flight
        self.failure: PcclError | None = None  # why the session ended; raised by later calls
        self.connected = False
        self._on_membership = on_membership
        self._votes: dict[str, asyncio.Future[Any]] = {}
        self._withdrawing: dict[str, int] = {}  # kind -> WithdrawVotes not yet acknowledged
        self._carried: dict[str, Any] = {}  # kind -> answer of a round a withdrawn vote made
        self._writer: asyncio.StreamWriter | None = None
        self.session = b""  # the master session's key (unwraps pair keys)
        self._up: asyncio.Future[None] | None = None  # done: a member of a live session
        self._hello: m.Hello | None = None  # this peer's registration, without rejoin data
        self._gen = 0  # the live session's number (a task of an older one stops)
        self._closing = False
        self._last_master = 0.0
        self._tasks = TaskSet("pccl_aio control plane")
        self.tickets = Tickets(Stash())  # ``attach`` gives it the data plane's stash
        self.registry: Registry | None = None
        self.on_measure: Callable[[m.MeasurePlan], None] | None = None  # the master's plans
        self.term, self.run_id, self.master = 0, "", ""  # the master's, as last heard
        self.revision = -1  # the shared-state revision of the last completed sync
        self.vote_seconds = 0.0  # spent waiting for the master's answers to votes (metrics)
        self.sync: tuple[int, bool | None] | None = None  # a sync's revision, our SyncDone
        self.rounds: dict[str, tuple[int, bool]] = {}  # kind -> last joint-vote round seen
        self.heard: dict[str, int] = {}  # kind -> rounds the run had answered (Membership)
        self.outage = Outage()
        self.arrivals = Arrivals()  # the master's word on joiners (``wait_for_peers``)

    @property
    def peer_group_world_size(self) -> int:
        """Peers of this peer's ring as of the last membership update."""
        return len(self.membership.ring) if self.membership else 0

    def ids(self, **fields: Any) -> dict[str, dict[str, Any]]:
        """``extra=`` for a log line of this peer: its run, peer and group ids and
        ``fields`` (``_log.ids``)."""
        return _log.ids(self.run_id, self.peer_id, self.config.peer_group, **fields)

    def attach(self, registry: Registry) -> None:
        """Reserve the tickets' seqs in the data plane's receive ``registry``."""
        self.tickets = Tickets(registry.stash, registry.reserve)
        self.registry = registry

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
        self._withdrawing.clear()
        self._carried.clear()
        self._hello = hello
        self._up = asyncio.get_running_loop().create_future()
        last: Exception | None = None
        for i in range(attempts):
            try:
                session = await open_session(self.config, self._hello_now(), self.term)
                break
            except (OSError, TimeoutError) as exc:
                if isinstance(exc, (AuthenticationError, VersionMismatchError)) or (
                        isinstance(exc, PcclTimeoutError) and i + 1 == attempts):
                    raise
                last = exc
                if i + 1 < attempts:
                    await asyncio.sleep(min(backoff * 2**i, 2.0))  # back-off, not a sync
        else:
            where = ", ".join(f"{h}:{p}" for h, p in self.config.masters)
            raise MasterConnectionError(
                f"no master at {where} after {attempts} attempt(s): {last!r}") from last
        self._begin(session)
        self.connected = True
        await self.wait_up()  # first Membership: accepted into the run

    def _hello_now(self) -> m.Hello:
        """This peer's ``Hello`` as of now: with its ``Rejoin`` once it had a master."""
        hello = self._hello
        assert hello is not None
        # a peer whose master stepped down joins afresh: its id may be another's there
        rejoin = self.outage.rejoin(self) if self.peer_id and not self.outage.demoted else None
        run_id = self.config.run_id or self.run_id
        return msgspec.structs.replace(hello, run_id=run_id, term=self.term, rejoin=rejoin)

    def _begin(self, session: Session) -> None:
        """A registered session: its reader and heartbeat tasks (the first ``Membership``
        completes ``wait_up``)."""
        w = session.welcome
        self.peer_id, self.session, self._writer = w.peer_id, session.key, session.writer
        self.term = max(self.term, w.term)
        self.run_id = w.run_id or self.run_id
        self.master = session.where
        self.outage.as_joiner = self.outage.since is not None and not (w.accepted or w.rebuild)
        self._gen += 1
        self._last_master = asyncio.get_running_loop().time()
        self._tasks.spawn(self._read_loop(session.reader, self._gen),
                          name="pccl_aio master reader")
        self._tasks.spawn(self._heartbeat_loop(self._gen), name="pccl_aio heartbeat")

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
        if self._writer is not None and not self._writer.is_closing():
            with contextlib.suppress(Exception):
                self._writer.write(frame(m.encode(m.Leave())))
        self.fail_all(MasterConnectionError("communicator closed"))

    def abort(self) -> None:
        """Drop the master connection at once (no goodbye), as a killed process would."""
        self._closing = True
        if self._writer is not None:
            self._writer.transport.abort()

    async def close(self) -> None:
        """Stop every task and close the master connection. Idempotent."""
        self._closing = True
        await self._tasks.close()
        close_quietly(self._writer)
        if self._writer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._writer.wait_closed(), 1.0)
            self._writer = None
        self.connected = False

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
        if self.failure is not None:
            raise self.failure
        if not self.up or self._writer is None or self._writer.is_closing():
            raise MasterLostError("the master is lost; this peer is rejoining the run")
        self._writer.write(b"".join(frame(m.encode(msg)) for msg in msgs))

    def fail_all(self, exc: PcclError) -> None:
        """The session ended for good: every vote, the join, every collective (and every
        launch waiting for a master) fails with ``exc``."""
        if self.failure is None:
            self.failure = exc
        for fut in list(self._votes.values()):
            if not fut.done():
                fut.set_exception(exc)
        self._votes.clear()
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
        close_quietly(self._writer)
        if (self._closing or isinstance(exc, KickedError) or self.config.master_timeout <= 0
                or self._hello is None):
            self.fail_all(exc)
            return
        self.outage.begin(self, exc)

    # ---- votes and collectives ------------------------------------------------------------
    async def vote(self, kind: str, msg: m.PeerToMaster) -> Any:
        """Send a vote and wait for its answer. Cancelling a vote takes it back
        (``WithdrawVote``), so the master no longer counts it.

        A withdrawal can lose the race against the other peers' votes: the round then
        completed with the withdrawn vote, and the others went on. Its answer (arriving before
        the master's ``VoteWithdrawn``) is carried to this peer's next vote of that kind
        (topology, pending, optimize: the group's calls stay in step), which then returns it
        without a new round; a sync that counted a withdrawn vote fails for the group instead.
        """
        if kind in self._votes:
            raise InvalidUsageError(f"a {kind} vote is already waiting on this peer")
        if kind in self._carried:
            return self._carried.pop(kind)
        if not self.up:
            joined = self.outage.joined
            await self.wait_up()  # a master is being found: the vote goes to the next one
            if self.outage.joined != joined:
                raise MasterLostError(f"{m.VOTE_CALLS.get(kind, kind)} was made before this "
                                      "peer rejoined the run as a new member: call again")
        if kind in self._votes:
            raise InvalidUsageError(f"a {kind} vote is already waiting on this peer")
        fut = self.expect(kind)
        try:
            self.send(msg)
        except BaseException:
            self._votes.pop(kind, None)
            raise
        t0 = asyncio.get_running_loop().time()
        try:
            return await fut
        except asyncio.CancelledError:
            if self._votes.get(kind) is fut and kind in _WITHDRAWABLE:
                del self._votes[kind]
                self._withdraw(kind)
            raise
        finally:
            self.vote_seconds += asyncio.get_running_loop().time() - t0

    def _withdraw(self, kind: str) -> None:
        with contextlib.suppress(PcclError):
            self.send(m.WithdrawVote(kind))  # type: ignore[arg-type]
            # answers of this kind until the master's VoteWithdrawn belong to the old vote
            self._withdrawing[kind] = self._withdrawing.get(kind, 0) + 1

    def expect(self, kind: str) -> asyncio.Future[Any]:
        """A future for the next master answer of ``kind``."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._votes[kind] = fut
        return fut

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
        self._send_launch(coll)
        coll.save_input()  # after the vote left: the copy overlaps the master's round trip
        self._early(coll)

    def relaunch(self) -> None:
        """The run is rejoined: the votes of the collectives launched meanwhile go out."""
        deferred, self.outage.deferred = self.outage.deferred, []
        for coll in deferred:
            if coll.future.done():
                continue
            try:
                self._send_launch(coll)
            except PcclError as exc:
                coll.on_lost(exc)
                continue
            self._early(coll)

    def _send_launch(self, coll: Collective) -> None:
        d, q = coll.dst, coll.quant
        seq, spoiled = self.tickets.use(coll.tag, self.membership)
        init = m.CollectiveInit(coll.tag, d.count, int(d.dtype), int(coll.op),
                                int(q.algo) if q else 0, int(q.dtype) if q else 0, seq, spoiled)
        msgs = (init, m.CollectiveWait(coll.tag)) if coll.awaited else (init,)
        try:
            self.send(*msgs)
        except BaseException:
            self.colls.pop(coll.tag, None)
            raise
        coll.ticket = seq if not spoiled else 0

    def _early(self, coll: Collective) -> None:
        seq = coll.ticket
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

    def report_measure(self, msg: m.MeasureReport) -> None:
        """A link measurement to the master; dropped if the session is over."""
        with contextlib.suppress(PcclError):
            self.send(msg)

    def report_sync(self, ok: bool, reason: str) -> None:
        """``SyncDone``: this peer's part of the sync finished (``ok``) or failed. Raises
        why it cannot be sent (``MasterLostError`` while the master is being replaced)."""
        if self.sync is not None:
            self.sync = (self.sync[0], ok)
        self.send(m.SyncDone(ok, reason))

    def report(self, tag: int, seq: int, ok: bool, reason: str, suspect: int = 0) -> None:
        """``CollectiveDone`` for (tag, seq); dropped if the session is over."""
        with contextlib.suppress(PcclError):
            self.send(m.CollectiveDone(tag, seq, ok, reason[:200], suspect))

    # ---- tasks ----------------------------------------------------------------------------
    async def _heartbeat_loop(self, gen: int) -> None:
        loop = asyncio.get_running_loop()
        while gen == self._gen:
            await asyncio.sleep(self.config.heartbeat_interval)  # the beacon's period
            if gen != self._gen:
                return
            if loop.time() - self._last_master > self.config.heartbeat_timeout:
                if self._writer is not None:
                    self._writer.transport.abort()
                self._lost(MasterConnectionError(
                    f"master silent for more than {self.config.heartbeat_timeout:.1f} s"), gen)
                return
            if self._writer is not None and not self._writer.is_closing():
                self._writer.write(frame(m.encode(m.Heartbeat())))

    async def _read_loop(self, reader: asyncio.StreamReader, gen: int) -> None:
        loop = asyncio.get_running_loop()
        exc: PcclError = MasterConnectionError("master closed the connection")
        try:
            while gen == self._gen:
                msg = m.decode_master_to_peer(await read_frame(reader))
                self._last_master = loop.time()
                if isinstance(msg, m.Kicked):
                    exc = KickedError(f"kicked by the master: {msg.reason}")
                    break
                if isinstance(msg, m.Superseded):  # rejoin the run where it is, as a joiner
                    self.term = max(self.term, msg.term)
                    self.outage.demoted = True
                    self.run_id = self.config.run_id
                    exc = MasterConnectionError(f"the master stepped down: {msg.reason}")
                    break
                self._dispatch(msg)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        except RemoteProtocolError as e:
            exc = MasterConnectionError(f"master broke the protocol: {e}")
        log.info("peer %d: %s", self.peer_id, exc, extra=self.ids(cause=str(exc)))
        self._lost(exc, gen)

    def _dispatch(self, msg: m.MasterToPeer) -> None:
        dispatch(self, msg)
