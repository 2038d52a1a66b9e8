"""The peer's side of the control plane: master connection, heartbeats, votes, dispatch.

One reader task dispatches master messages *synchronously and in order* (votes' answers,
membership, collective verdicts); one heartbeat task keeps both sides' liveness. When the
master connection ends, every waiting call fails with ``MasterConnectionError`` (or
``KickedError`` if the master said why) and every later call raises the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable
from typing import Any

from .._errors import (
    AuthenticationError,
    DeadlockError,
    InvalidUsageError,
    KickedError,
    MasterConnectionError,
    PcclError,
    PcclTimeoutError,
    RemoteProtocolError,
    SharedStateError,
    VersionMismatchError,
)
from .._net.handshake import HandshakeError, greet
from .._net.stream import read_frame, set_nodelay
from .._net.tasks import TaskSet
from .._wire import auth
from .._wire import messages as m
from .._wire.framing import frame
from .collective import Collective
from .core.config import PeerConfig
from .core.stash import Stash
from .core.tickets import Tickets
from .receiver import Registry

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
        self._joined: asyncio.Future[None] | None = None
        self._last_master = 0.0
        self._tasks = TaskSet("pccl_aio control plane")
        self.tickets = Tickets(Stash())  # ``attach`` gives it the data plane's stash
        self.on_measure: Callable[[m.MeasurePlan], None] | None = None  # the master's plans

    @property
    def peer_group_world_size(self) -> int:
        """Peers of this peer's ring as of the last membership update."""
        return len(self.membership.ring) if self.membership else 0

    def attach(self, registry: Registry) -> None:
        """Reserve the tickets' seqs in the data plane's receive ``registry``."""
        self.tickets = Tickets(registry.stash, registry.reserve)

    # ---- session --------------------------------------------------------------------------
    async def connect(self, hello: m.Hello, attempts: int, backoff: float) -> None:
        """Open the master connection, say ``hello`` and wait until accepted into the run.

        Retries ``attempts`` times with exponential back-off while no master answers; the
        handshake (connect, run secret, ``Welcome``) of each attempt is bounded by the
        heartbeat timeout. Raises ``MasterConnectionError`` (``VersionMismatchError``,
        ``AuthenticationError`` for a refused or failed handshake or TLS),
        ``PcclTimeoutError`` for a master that accepts and never answers. Cancelling leaves
        the connection for ``close`` to release.
        """
        self.failure = None
        self._withdrawing.clear()
        self._carried.clear()
        last: Exception | None = None
        cfg = self.config
        for i in range(attempts):
            try:
                async with asyncio.timeout(cfg.heartbeat_timeout):
                    reader, writer = await asyncio.open_connection(
                        cfg.master_host, cfg.master_port, ssl=cfg.ssl,
                        server_hostname=cfg.master_host if cfg.ssl else None)
                break
            except (OSError, TimeoutError) as exc:
                if cfg.ssl is not None and isinstance(exc, (ssl.SSLError, ConnectionResetError)):
                    raise AuthenticationError(  # the TCP connect succeeded: TLS failed
                        f"TLS with the master at {cfg.master_host}:{cfg.master_port} failed: "
                        f"{exc!r}") from exc
                last = exc
                if i + 1 < attempts:
                    await asyncio.sleep(min(backoff * 2**i, 2.0))  # back-off, not a sync
        else:
            raise MasterConnectionError(
                f"no master at {cfg.master_host}:{cfg.master_port} after {attempts} "
                f"attempt(s): {last!r}") from last
        set_nodelay(writer.transport)
        self._writer = writer
        try:
            async with asyncio.timeout(cfg.heartbeat_timeout):
                self.session = await greet(reader, writer, auth.ROLE_MASTER, cfg.key, 0, 0)
                writer.write(frame(m.encode(hello)))
                reply = m.decode_master_to_peer(await read_frame(reader))
                while isinstance(reply, m.MasterHeartbeat):  # a tick may precede the Welcome
                    reply = m.decode_master_to_peer(await read_frame(reader))
        except HandshakeError as exc:
            if exc.status == auth.BAD_VERSION:
                raise VersionMismatchError(f"the master refused this peer: {exc}") from None
            raise AuthenticationError(
                f"the master at {cfg.master_host}:{cfg.master_port} refused this peer: "
                f"{exc}") from None
        except TimeoutError:
            raise PcclTimeoutError(
                f"the master at {cfg.master_host}:{cfg.master_port} accepted the connection "
                f"but did not answer within {cfg.heartbeat_timeout:.1f} s") from None
        except (asyncio.IncompleteReadError, OSError, RemoteProtocolError) as exc:
            raise MasterConnectionError(f"master closed the connection: {exc!r}") from exc
        if isinstance(reply, m.Rejected):
            cls = VersionMismatchError if reply.version != m.PROTOCOL_VERSION else MasterConnectionError
            raise cls(f"master refused this peer: {reply.reason}")
        if not isinstance(reply, m.Welcome):
            raise MasterConnectionError(f"unexpected first message {reply!r}")
        loop = asyncio.get_running_loop()
        self.peer_id = reply.peer_id
        self._joined = loop.create_future()
        self._last_master = loop.time()
        self._tasks.spawn(self._read_loop(reader), name="pccl_aio master reader")
        self._tasks.spawn(self._heartbeat_loop(), name="pccl_aio heartbeat")
        await self._joined  # first Membership: accepted into the run
        self.connected = True

    def leave(self) -> None:
        """Say goodbye to the master (best effort) and fail everything still waiting."""
        if self._writer is not None and not self._writer.is_closing():
            with contextlib.suppress(Exception):
                self._writer.write(frame(m.encode(m.Leave())))
        self.fail_all(MasterConnectionError("communicator closed"))

    def abort(self) -> None:
        """Drop the master connection at once (no goodbye)."""
        if self._writer is not None:
            self._writer.transport.abort()

    async def close(self) -> None:
        """Stop both tasks and close the master connection. Idempotent."""
        await self._tasks.close()
        if self._writer is not None:
            self._writer.close()
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
        batch). Raises why the session ended if the connection is gone."""
        if self._writer is None or self._writer.is_closing():
            raise self.failure or MasterConnectionError("master connection closed")
        self._writer.write(b"".join(frame(m.encode(msg)) for msg in msgs))

    def fail_all(self, exc: PcclError) -> None:
        """The session ended: every vote, the join and every collective fail with ``exc``."""
        if self.failure is None:
            self.failure = exc
        for fut in list(self._votes.values()):
            if not fut.done():
                fut.set_exception(exc)
        self._votes.clear()
        if self._joined is not None and not self._joined.done():
            self._joined.set_exception(exc)
        for coll in list(self.colls.values()):
            coll.on_lost(exc)
        self.colls.clear()

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
        fut = self.expect(kind)
        try:
            self.send(msg)
        except BaseException:
            self._votes.pop(kind, None)
            raise
        try:
            return await fut
        except asyncio.CancelledError:
            if self._votes.get(kind) is fut and kind in _WITHDRAWABLE:
                del self._votes[kind]
                self._withdraw(kind)
            raise

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
        d, q = coll.dst, coll.quant
        seq, spoiled = self.tickets.use(coll.tag, self.membership)
        init = m.CollectiveInit(coll.tag, d.count, int(d.dtype), int(coll.op),
                                int(q.algo) if q else 0, int(q.dtype) if q else 0, seq, spoiled)
        msgs = (init, m.CollectiveWait(coll.tag)) if awaited else (init,)
        self.send(*msgs)
        self.colls[coll.tag] = coll
        coll.hooks.append(self._forget)
        coll.awaited = awaited
        coll.save_input()  # after the vote left: the copy overlaps the master's round trip
        if seq and not spoiled and self.membership is not None:
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

    def report(self, tag: int, seq: int, ok: bool, reason: str, suspect: int = 0) -> None:
        """``CollectiveDone`` for (tag, seq); dropped if the session is over."""
        with contextlib.suppress(PcclError):
            self.send(m.CollectiveDone(tag, seq, ok, reason[:200], suspect))

    # ---- tasks ----------------------------------------------------------------------------
    async def _heartbeat_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.config.heartbeat_interval)  # the beacon's period
            if loop.time() - self._last_master > self.config.heartbeat_timeout:
                self.fail_all(MasterConnectionError(
                    f"master silent for more than {self.config.heartbeat_timeout:.1f} s"))
                self.abort()
                return
            with contextlib.suppress(PcclError):
                self.send(m.Heartbeat())

    async def _read_loop(self, reader: asyncio.StreamReader) -> None:
        loop = asyncio.get_running_loop()
        exc: PcclError = MasterConnectionError("master closed the connection")
        try:
            while True:
                msg = m.decode_master_to_peer(await read_frame(reader))
                self._last_master = loop.time()
                if isinstance(msg, m.Kicked):
                    exc = KickedError(f"kicked by the master: {msg.reason}")
                    break
                self._dispatch(msg)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        except RemoteProtocolError as e:
            exc = MasterConnectionError(f"master broke the protocol: {e}")
        log.info("peer %d: %s", self.peer_id, exc)
        self.fail_all(exc)
        if self._writer is not None:
            self._writer.close()

    def _dispatch(self, msg: m.MasterToPeer) -> None:
        match msg:
            case m.Membership():
                self.membership = msg
                self.tickets.void()
                self._on_membership(msg)
                if self._joined is not None and not self._joined.done():
                    self._joined.set_result(None)
            case m.CollectiveStart(tag=tag, seq=seq):
                coll = self.colls.get(tag)
                if coll is not None and self.membership is not None:
                    coll.on_start(seq, [p.peer_id for p in self.membership.ring], self.peer_id)
            case m.CollectiveComplete(tag=tag):
                self.tickets.issued(msg)
                if (coll := self.colls.get(tag)) is not None:
                    coll.on_complete()
            case m.CollectiveAbort(tag=tag, reason=reason):
                if (coll := self.colls.get(tag)) is not None:
                    coll.on_abort(reason)
            case m.CollectiveRejected(tag=tag, reason=reason, deadlock=deadlock):
                if (coll := self.colls.get(tag)) is not None:
                    coll.on_rejected(reason, deadlock)
            case m.TopologyUpdated():
                self._resolve("topology", None)
            case m.SyncPlan():
                self._resolve("sync", msg)
            case m.SyncFailed(reason=reason, completed=completed):
                exc = SharedStateError(f"shared-state sync failed: {reason}")
                self._reject("sync_done" if completed else "sync", exc)
            case m.VoteWithdrawn(kind=kind):
                if (n := self._withdrawing.get(kind, 0)) > 1:
                    self._withdrawing[kind] = n - 1
                else:
                    self._withdrawing.pop(kind, None)
            case m.SyncComplete():
                self._resolve("sync_done", msg)
            case m.VoteRejected(kind=kind, reason=reason, deadlock=deadlock):
                cls = DeadlockError if deadlock else InvalidUsageError
                self._reject(kind, cls(f"{m.VOTE_CALLS.get(kind, kind)} failed: {reason}"))
            case m.PeersPendingAnswer(pending=pending):
                self._resolve("pending", pending)
            case m.TopologyOptimized():
                self._resolve("optimize", msg)
            case m.MeasurePlan():
                if self.on_measure is not None:
                    self.on_measure(msg)
            case _:
                pass  # MasterHeartbeat: liveness only

    def _resolve(self, kind: str, value: Any) -> None:
        if kind in self._withdrawing:  # a round that counted a vote taken back
            if kind in ("topology", "pending", "optimize"):
                fut = self._votes.pop(kind, None)
                if fut is not None and not fut.done():  # the next vote is out: it is this
                    fut.set_result(value)               # round's, and its copy goes back
                    self._withdraw(kind)
                else:
                    self._carried[kind] = value
            return
        fut = self._votes.pop(kind, None)
        if fut is not None and not fut.done():
            fut.set_result(value)

    def _reject(self, kind: str, exc: PcclError) -> None:
        if kind in self._withdrawing:
            return
        fut = self._votes.pop(kind, None)
        if fut is not None and not fut.done():
            fut.set_exception(exc)
