"""The peer's side of the control plane: master connection, heartbeats, message dispatch.

One reader task dispatches master messages *synchronously and in order* (votes' answers,
membership, collective verdicts); one heartbeat task keeps both sides' liveness. When the
master connection ends, every waiting call fails with ``MasterConnectionError`` (or
``KickedError`` if the master said why) and every later call raises the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from .._errors import (
    InvalidUsageError,
    KickedError,
    MasterConnectionError,
    PcclError,
    RemoteProtocolError,
    SharedStateError,
    VersionMismatchError,
)
from .._net.stream import read_frame, set_nodelay
from .._types import DataType
from .._wire import messages as m
from .._wire.framing import frame
from .collective import Collective
from .core.shared_state import SharedState
from .dataplane import Link, Listener, Registry
from .transfer import StateServer

log = logging.getLogger("pccl_aio.communicator")


class ScratchPool:
    """Reusable receive buffers, so a 64 MiB all-reduce does not page-fault a new one each time.

    Plain ``bytearray``s, on purpose: ``np.empty`` (which asks for transparent huge pages) made
    the P = 3 64 MiB loopback all-reduce ~25 % slower on the 2-core reference VM (paired runs,
    see bench/RESULTS.md).
    """

    def __init__(self, keep: int = 16) -> None:
        self._free: list[bytearray] = []
        self._keep = keep

    def take(self, nbytes: int) -> tuple[bytearray, memoryview]:
        """A buffer of at least ``nbytes`` and a view of its first ``nbytes`` (contents stale)."""
        for i, b in enumerate(self._free):
            if len(b) >= nbytes:
                del self._free[i]
                return b, memoryview(b)[:nbytes]
        b = bytearray(nbytes)
        return b, memoryview(b)

    def give(self, b: bytearray) -> None:
        self._free.append(b)
        self._free.sort(key=len)
        del self._free[: max(0, len(self._free) - self._keep)]


class ControlPlane:
    """State and plumbing shared by the public ``Communicator`` methods."""

    def __init__(self, host: str, port: int, peer_group: int, p2p_connections: int,
                 listen_host: str, advertise_host: str, heartbeat_interval: float,
                 heartbeat_timeout: float, data_timeout: float) -> None:
        self.master_host, self.master_port = host, port
        self.peer_group = peer_group
        self.p2p_connections = p2p_connections
        self.listen_host, self.advertise_host = listen_host, advertise_host
        self.heartbeat_interval = heartbeat_interval
        self.heartbeat_timeout = heartbeat_timeout
        self.data_timeout = data_timeout
        self.peer_id = 0
        self._membership: m.Membership | None = None
        self._colls: dict[int, Collective] = {}
        self._votes: dict[str, asyncio.Future[Any]] = {}
        self._registry = Registry()
        self._scratch = ScratchPool()
        self._links: dict[int, Link] = {}
        self._listener: Listener | None = None
        self._state_server = StateServer()
        self._serving: SharedState | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._joined: asyncio.Future[None] | None = None
        self._error: PcclError | None = None
        self._connected = False
        self._last_master = 0.0

    # ---- session --------------------------------------------------------------------------------
    async def connect(self, attempts: int = 5, *, backoff: float = 0.2) -> None:
        """Register with the master and wait until this peer is accepted into the run.

        The first peer is accepted at once; later ones wait until the accepted peers call
        ``update_topology()``. Retries ``attempts`` times with exponential back-off while no
        master answers. Raises ``MasterConnectionError`` (``VersionMismatchError`` for a
        master of another protocol version), ``InvalidUsageError`` if already connected.
        Cancelling closes everything opened so far.
        """
        if self._connected or self._writer is not None:
            raise InvalidUsageError("connect() called twice")
        if attempts < 1:
            raise InvalidUsageError(f"attempts must be >= 1, not {attempts}")
        self._error = None
        try:
            await self._connect(attempts, backoff)
        except BaseException:
            await self._teardown()
            raise

    async def _connect(self, attempts: int, backoff: float) -> None:
        loop = asyncio.get_running_loop()
        self._listener = Listener(self._registry)
        await self._listener.start(self.listen_host)
        self._state_server.lookup = lambda key, rev: self._lookup_state(key, rev)
        await self._state_server.start(self.listen_host)
        last: Exception | None = None
        for i in range(attempts):
            try:
                reader, writer = await asyncio.open_connection(self.master_host, self.master_port)
                break
            except OSError as exc:
                last = exc
                if i + 1 < attempts:
                    await asyncio.sleep(min(backoff * 2**i, 2.0))
        else:
            raise MasterConnectionError(
                f"no master at {self.master_host}:{self.master_port} after {attempts} "
                f"attempt(s): {last}") from last
        set_nodelay(writer.transport)
        self._writer = writer
        writer.write(frame(m.encode(m.Hello(m.PROTOCOL_VERSION, self.peer_group,
                                            self._listener.port, self.advertise_host,
                                            self._state_server.port))))
        try:
            reply = m.decode_master_to_peer(await read_frame(reader))
        except (asyncio.IncompleteReadError, OSError, RemoteProtocolError) as exc:
            raise MasterConnectionError(f"master closed the connection: {exc!r}") from exc
        if isinstance(reply, m.Rejected):
            cls = VersionMismatchError if reply.version != m.PROTOCOL_VERSION else MasterConnectionError
            raise cls(f"master refused this peer: {reply.reason}")
        if not isinstance(reply, m.Welcome):
            raise MasterConnectionError(f"unexpected first message {reply!r}")
        self.peer_id = reply.peer_id
        self._joined = loop.create_future()
        self._last_master = loop.time()
        self._tasks = [asyncio.ensure_future(self._read_loop(reader)),
                       asyncio.ensure_future(self._heartbeat_loop())]
        await self._joined  # first Membership: accepted into the run
        self._connected = True
        log.info("peer %d joined: world size %d", self.peer_id, self._membership_ws())

    def _membership_ws(self) -> int:
        return self._membership.global_world_size if self._membership else 0

    async def close(self) -> None:
        """Leave the run gracefully and release every socket and task.

        Collectives still in flight fail with ``MasterConnectionError``. Idempotent.
        """
        if self._writer is not None and not self._writer.is_closing():
            with contextlib.suppress(Exception):
                self._writer.write(frame(m.encode(m.Leave())))
        self._fail_all(MasterConnectionError("communicator closed"))
        await self._teardown()

    async def _teardown(self) -> None:
        for t in self._tasks:
            t.cancel()
        current = asyncio.current_task()
        others = [t for t in self._tasks if t is not current]
        if others:
            await asyncio.gather(*others, return_exceptions=True)
        self._tasks = []
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._writer.wait_closed(), 1.0)
            self._writer = None
        for link in self._links.values():
            link.close()
        self._links.clear()
        if self._listener is not None:
            await self._listener.close()
            self._listener = None
        await self._state_server.close()
        self._connected = False

    def _check_usable(self) -> None:
        if self._error is not None:
            raise self._error
        if not self._connected:
            raise InvalidUsageError("not connected: call connect() first")

    def _send(self, msg: Any) -> None:
        if self._writer is None or self._writer.is_closing():
            raise self._error or MasterConnectionError("master connection closed")
        self._writer.write(frame(m.encode(msg)))

    def _fail_all(self, exc: PcclError) -> None:
        if self._error is None:
            self._error = exc
        for fut in list(self._votes.values()):
            if not fut.done():
                fut.set_exception(exc)
        self._votes.clear()
        if self._joined is not None and not self._joined.done():
            self._joined.set_exception(exc)
        for coll in list(self._colls.values()):
            coll.on_lost(exc)
        self._colls.clear()

    # ---- votes and collectives ----------------------------------------------------------------
    async def _vote(self, kind: str, msg: Any) -> Any:
        if kind in self._votes:
            raise InvalidUsageError(f"a {kind} vote is already waiting on this peer")
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._votes[kind] = fut
        try:
            self._send(msg)
        except BaseException:
            self._votes.pop(kind, None)
            raise
        return await fut

    def _expect(self, kind: str) -> asyncio.Future[Any]:
        """A future for the next master answer of ``kind`` that needs no vote from us."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._votes[kind] = fut
        return fut

    def _lookup_state(self, key: str, revision: int) -> memoryview | None:
        state = self._serving
        if state is None or key not in state.keys:
            return None
        return state.view(key)

    def _launch(self, coll: Collective) -> None:
        self._colls[coll.tag] = coll
        coll.hooks.append(self._forget)
        d, q = coll.dst, coll.quant
        self._send(m.CollectiveInit(coll.tag, d.count, int(d.dtype), int(coll.op),
                                    int(q.algo) if q else 0,
                                    int(DataType.parse(q.dtype)) if q else 0))
        coll.save_input()  # after the vote left: the copy overlaps the master's round trip

    def _forget(self, coll: Collective) -> None:
        if self._colls.get(coll.tag) is coll:
            del self._colls[coll.tag]

    def _cancel(self, coll: Collective) -> None:
        """The caller stopped waiting: fail the attempt for the group, keep the tag until the verdict."""
        coll.cancelled = True
        if not coll.seq:  # still voting: withdraw, the master aborts it for the group
            self._send_done(coll.tag, 0, False, "cancelled by the caller")
        elif coll.active:
            coll.active = False
            self._send_done(coll.tag, coll.seq, False, "cancelled by the caller")

    def _send_done(self, tag: int, seq: int, ok: bool, reason: str) -> None:
        with contextlib.suppress(PcclError):
            self._send(m.CollectiveDone(tag, seq, ok, reason[:200]))

    async def _link(self, peer_id: int) -> Link:
        link = self._links.get(peer_id)
        if link is None or link.broken:
            if link is not None:
                link.close()
            addr = next((p for p in self._membership.ring if p.peer_id == peer_id), None) \
                if self._membership else None
            if addr is None:
                raise ConnectionError(f"peer {peer_id} is not in the ring")
            link = Link(peer_id, addr.host, addr.port, self.p2p_connections, self.peer_id)
            self._links[peer_id] = link
        await link.open()
        return link

    # ---- tasks ----------------------------------------------------------------------------------
    async def _heartbeat_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            if loop.time() - self._last_master > self.heartbeat_timeout:
                self._fail_all(MasterConnectionError(
                    f"master silent for more than {self.heartbeat_timeout:.1f} s"))
                if self._writer is not None:
                    self._writer.transport.abort()
                return
            with contextlib.suppress(PcclError):
                self._send(m.Heartbeat())

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
        self._fail_all(exc)
        if self._writer is not None:
            self._writer.close()

    def _dispatch(self, msg: m.MasterToPeer) -> None:
        match msg:
            case m.Membership():
                self._on_membership(msg)
            case m.CollectiveStart(tag=tag, seq=seq):
                coll = self._colls.get(tag)
                if coll is not None and self._membership is not None:
                    coll.on_start(seq, [p.peer_id for p in self._membership.ring], self.peer_id)
            case m.CollectiveComplete(tag=tag):
                if (coll := self._colls.get(tag)) is not None:
                    coll.on_complete()
            case m.CollectiveAbort(tag=tag, reason=reason):
                if (coll := self._colls.get(tag)) is not None:
                    coll.on_abort(reason)
            case m.CollectiveRejected(tag=tag, reason=reason):
                if (coll := self._colls.get(tag)) is not None:
                    coll.on_rejected(reason)
            case m.TopologyUpdated():
                self._resolve("topology", None)
            case m.SyncPlan():
                self._resolve("sync", msg)
            case m.SyncFailed(reason=reason):
                fut = self._votes.pop("sync", None)
                if fut is not None and not fut.done():
                    fut.set_exception(SharedStateError(f"shared-state sync failed: {reason}"))
            case m.SyncComplete():
                self._resolve("sync_done", msg)
            case m.VoteRejected(kind=kind, reason=reason):
                fut = self._votes.pop(kind, None)
                if fut is not None and not fut.done():
                    fut.set_exception(InvalidUsageError(f"{kind} vote withdrawn: {reason}"))
            case m.PeersPendingAnswer(pending=pending):
                self._resolve("pending", pending)
            case _:
                pass  # MasterHeartbeat: liveness only

    def _resolve(self, kind: str, value: Any) -> None:
        fut = self._votes.pop(kind, None)
        if fut is not None and not fut.done():
            fut.set_result(value)

    def _on_membership(self, msg: m.Membership) -> None:
        self._membership = msg
        alive = {p.peer_id for p in msg.ring}
        for pid in [p for p in self._links if p not in alive]:
            self._links.pop(pid).close()
        if self._joined is not None and not self._joined.done():
            self._joined.set_result(None)
