"""The asyncio master: moves frames between sockets and the sans-IO ``MasterState``.

Usage as a library: ``async with pccl_aio.Master("127.0.0.1", 0) as master: ...`` (the OS
picks a port; ``master.port`` tells it). From the command line:
``python -m pccl_aio.master --host 0.0.0.0 --port 48148 --log-level INFO``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl as _ssl
from collections.abc import Sequence
from types import TracebackType

from .._errors import InvalidUsageError, RemoteProtocolError
from .._net.credentials import client_context, run_key
from .._net.handshake import HANDSHAKE_TIMEOUT, Gate
from .._net.stream import FrameBudget, at_eof, own_socket, read_frame, set_nodelay
from .._net.tasks import TaskSet
from .._wire import auth, liveness
from .._wire import messages as m
from .._wire.address import parse_address
from .._wire.framing import MAX_FRAME_SIZE, frame
from . import kept
from .core import state as ms
from .core.records import is_loopback
from .keys import MasterKeys
from .status import Limits, Status, http_servers
from .story import Story
from .watch import first_frame, watch

__all__ = ["Master"]

log = logging.getLogger("pccl_aio.master")


class Master:
    """A master server: tracks membership, votes and collectives of one run.

    Args:
        host: address to listen on.
        port: TCP port; 0 lets the OS choose (read ``port`` after ``start()``).
        heartbeat_interval: seconds between the master's liveness beacons to each peer
            (default: a third of ``heartbeat_timeout``, as a peer's).
        heartbeat_timeout: a peer silent this long is treated as dead (default 5 s).
        max_frame_size: larger control frames close the connection that sent them (before
            its ``Hello``, a connection may send frames of at most 64 KiB, and frames above
            64 KiB being received at once share 32 MiB over all connections).
        secret: the run secret every peer must prove (``str`` or ``bytes``, at least 128 bits:
            ``python -m pccl_aio.secret`` makes one; a weaker one raises
            ``InvalidUsageError``); None reads ``$PCCL_AIO_SECRET_FILE`` or
            ``$PCCL_AIO_SECRET`` and runs without one if neither is set. A connection that
            fails the handshake is closed before anything else is read (docs, "Security").
        ssl: a server ``ssl.SSLContext``: every peer connection is TLS.
        vote_timeout: a member that has not cast a vote (or launched a collective) for this
            many seconds while every other member of its group waits in it, and waits on
            nothing itself, is kicked (it stalls the run). Make it longer than the largest
            honest gap between the peers' arrivals at a vote; None: never kicked.
        master_secret: a second secret, given to the run's masters only (never to peers):
            every ``Membership`` then carries a seal of the peer's place, and a restarted
            master believes a rejoining peer's id, term and ring only with a valid seal, so
            no member can claim another's place (docs, "Security"). None: with a run
            secret, the one kept in ``$PCCL_AIO_STATE_DIR`` (``_master/kept.py``; made there
            on the first start, found there by a restarted master); "": no seals.
        handshake_timeout: a connection must complete the handshake within this many seconds.
        hello_timeout: ... and then say ``Hello`` within this many seconds.
        allow_any_advertise_host: accept a peer's ``advertise_host`` that is not the address
            its connection comes from (else it is refused: a joiner could point the other
            peers' traffic anywhere).
        max_pending_peers: peers waiting for admission at once; more are refused.
        max_collectives_per_peer: collectives a member may have launched and not ended; one
            more closes its connection.
        admission_interval: ``are_peers_pending()`` answers True at most once per interval,
            so joiners are admitted in batches and a flood of them cannot stall the run.
        run_id: the run this master serves; peers of another run are refused (None: the
            run of the first peer, or a fresh id).
        recovery_grace: a master that rebuilds a run from rejoining peers (after a restart;
            docs, "Master failover") waits this long for the members that have not
            rejoined, then goes on without them (default: twice ``heartbeat_timeout``: a
            member notices the loss within one, and its reconnection may take another).
        others: ``"host:port"`` of the run's other masters (standbys). Each is asked every
            ``heartbeat_timeout`` which run and term it serves; finding the run served at a
            higher term there, this master steps down and its peers move there. (Over TLS
            the others' certificates must verify against the system's CAs.)
        status_port: serve the live status page (``/``) and ``/status.json`` over HTTP on
            this port (0: the OS picks; ``status_address`` tells it); None: no page.
        metrics_port: serve Prometheus metrics at ``/metrics`` on this port (may be the
            status port); None: none.
        http_host: the interface of those HTTP ports (default loopback: the page shows the
            peers' addresses and has no authentication).
        http_limits: connections each HTTP port serves at once, in all and per client
            address, and the deadline of a request's head (default ``Limits()``: 32, 4, 2 s;
            docs, "Security").

    ``status.snapshot()`` is the run at a glance as a dict (what ``/status.json`` serves),
    ``story`` the counters and recent events behind it; both are read-only views.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 48148, *,
                 heartbeat_interval: float | None = None, heartbeat_timeout: float = 5.0,
                 max_frame_size: int = MAX_FRAME_SIZE, secret: str | bytes | None = None,
                 ssl: _ssl.SSLContext | None = None,
                 handshake_timeout: float = HANDSHAKE_TIMEOUT, hello_timeout: float = 5.0,
                 allow_any_advertise_host: bool = False, max_pending_peers: int = 256,
                 max_collectives_per_peer: int = 1024, admission_interval: float = 1.0,
                 run_id: str | None = None, recovery_grace: float | None = None,
                 others: Sequence[str] = (), status_port: int | None = None,
                 metrics_port: int | None = None, http_host: str = "127.0.0.1",
                 master_secret: str | bytes | None = None,
                 vote_timeout: float | None = 600.0,
                 http_limits: Limits | None = None) -> None:
        if run_id is not None and not (isinstance(run_id, str) and 0 < len(run_id) <= 128
                                       and run_id.isprintable()):
            raise InvalidUsageError(f"run_id must be 1-128 printable characters, not {run_id!r}")
        self._others = [parse_address(a, "another master's") for a in others]
        self.host = host
        self._port = port
        self.heartbeat_interval = liveness.interval(heartbeat_timeout, heartbeat_interval)
        if not 0 < self.heartbeat_interval < float("inf") or not heartbeat_timeout > 0:
            raise InvalidUsageError("heartbeat_interval and heartbeat_timeout must be positive")
        self.state = ms.MasterState(
            heartbeat_timeout=heartbeat_timeout, hello_timeout=hello_timeout,
            allow_any_advertise_host=allow_any_advertise_host,
            max_pending_peers=max_pending_peers,
            max_collectives_per_peer=max_collectives_per_peer,
            admission_interval=admission_interval, run_id=run_id or "",
            recovery_grace=recovery_grace, vote_timeout=vote_timeout)
        self._max_frame = max_frame_size
        self._budget = FrameBudget(_LARGE_FRAMES)
        self._key = run_key(secret)
        if master_secret is None and self._key:  # (with a run secret: sealed by default)
            master_secret = kept.master_secret_in(kept.default_path(self._key), False)
        self._keys = MasterKeys(bool(self._key), run_key(master_secret) if master_secret
                                else b"")
        self._ssl = ssl
        self.gate = Gate("pccl_aio master", handshake_timeout)
        self._sessions: dict[int, bytes] = {}  # conn -> session key (wraps its pair keys)
        self._gone: dict[int, asyncio.Future[None]] = {}  # conn -> resolved when it closed
        self._server: asyncio.Server | None = None
        self._writers: dict[int, asyncio.StreamWriter] = {}  # open and not closed by the state
        self._owners: dict[int, asyncio.StreamWriter] = {}  # conn -> the connection named so
        self._tasks = TaskSet("pccl_aio master")
        self._closed = asyncio.Event()
        self.story = Story(self.state)
        self.status = Status(self.state, self.story,
                             lambda: asyncio.get_running_loop().time(), lambda: self.address)
        self._http = http_servers(self.status, http_host, status_port, metrics_port,
                                  http_limits)

    @property
    def port(self) -> int:
        """The port the master listens on (the OS's choice when constructed with 0)."""
        return self._port

    @property
    def address(self) -> str:
        """``host:port``, ready for ``Communicator(address)``."""
        return f"{self.host}:{self._port}"

    async def start(self) -> None:
        """Bind and start serving; returns once the socket listens. Raises OSError on bind
        failure."""
        self._server = await asyncio.start_server(
            self._on_client, self.host, self._port, ssl=self._ssl,
            ssl_handshake_timeout=self.gate.timeout if self._ssl else None)
        self._port = self._server.sockets[0].getsockname()[1]
        self._tasks.spawn(self._ticker())
        for server in self._http:
            try:
                await server.start()
            except OSError as exc:  # its filename says which address (the CLI prints it)
                await self.close()
                raise OSError(exc.errno, exc.strerror, f"{server.host}:{server.port}") from exc
        if self._others:
            self._tasks.spawn(watch(self._others, self._key, client_context(self._ssl),
                              self.state.heartbeat_timeout, self._heard))
        log.info("pccl_aio master listening on %s:%d (%s, %s)", self.host, self._port,
                 "run secret" if self._key else "no run secret",
                 "TLS" if self._ssl else "no TLS")
        if not self._key and not all(is_loopback(s.getsockname()[0])
                                     for s in self._server.sockets):
            log.warning("listening on %s without a run secret: anyone who reaches this port "
                        "can join the run (set --secret-file or PCCL_AIO_SECRET)", self.host)

    @property
    def status_address(self) -> str:
        """``http://host:port/`` of the status page ("" without one)."""
        return next((f"http://{h.host}:{h.port}/" for h in self._http if "/" in h.routes), "")

    @property
    def metrics_address(self) -> str:
        """``http://host:port/metrics`` ("" without metrics)."""
        return next((f"http://{h.host}:{h.port}/metrics" for h in self._http
                     if "/metrics" in h.routes), "")

    async def close(self) -> None:
        """Stop listening, close every peer connection and wait for all tasks to end."""
        if self._server is not None:
            self._server.close()
        for server in self._http:
            await server.close()
        for w in list(self._writers.values()):
            w.close()
        await self._tasks.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
        self._closed.set()

    async def serve_forever(self) -> None:
        """Block until ``close()`` is called (or the task is cancelled)."""
        await self._closed.wait()

    async def __aenter__(self) -> Master:
        await self.start()
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    # ---- internals --------------------------------------------------------------------------
    def _apply(self, actions: list[ms.Action]) -> None:
        last, data = None, b""  # (one message to many, a start or a heartbeat: encoded once)
        for act in actions:
            writer = self._writers.get(act.conn)
            if writer is None:
                continue
            if isinstance(act, ms.Send):
                if not writer.is_closing():
                    msg = act.msg
                    if isinstance(msg, m.Membership):
                        msg = self._membership(act.conn, msg)
                    if msg is not last:
                        last, data = msg, frame(m.encode(msg))
                    writer.write(data)
                    if (backlog := writer.transport.get_write_buffer_size()) > _BACKLOG:
                        log.warning("closing connection %d: it does not read what the master "
                                    "sends (%d bytes waiting)", act.conn, backlog)
                        self._writers.pop(act.conn, None)
                        writer.transport.abort()  # its reader task reports the disconnect
            else:
                log.debug("closing connection %d: %s", act.conn, act.reason)
                self._writers.pop(act.conn, None)
                writer.close()

    def _membership(self, conn: int, msg: m.Membership) -> m.Membership:
        """``msg`` with ``conn``'s pair keys and seal (``MasterKeys.membership``)."""
        peer = self.state.access.peer(conn)
        return self._keys.membership(msg, conn, self._sessions[conn],
                                     peer.group if peer is not None else 0, self.state.run_id)

    def _handle(self, event: ms.Event) -> None:
        actions = self.state.handle(event)
        self.story.observe(event, actions)
        self._apply(actions)

    async def _ticker(self) -> None:
        """A ``Tick`` every ``liveness.period``; a beacon to every peer once per
        ``heartbeat_interval``."""
        loop = asyncio.get_running_loop()
        period = liveness.period(self.heartbeat_interval, self.state.heartbeat_timeout)
        last = beaconed = loop.time()
        while True:
            await asyncio.sleep(period)
            now = loop.time()
            stood_still, last = now - last > self.state.heartbeat_timeout / 2, now
            if stood_still:
                continue  # this master stood still (stopped, swapped): read what the peers
                # sent meanwhile first
            beacon = liveness.due(now, beaconed, self.heartbeat_interval, period)
            beaconed = now if beacon else beaconed  # before judging their silence
            self._handle(ms.Tick(now, beacon))
            self.status.sample()

    def _heard(self, answer: m.ProbeAnswer, where: str) -> None:
        before = self.state.term
        self._handle(ms.Heard(answer, where, asyncio.get_running_loop().time()))
        if self.state.term != before:
            log.warning("the master at %s serves this run at term %d: this one (term %d) "
                        "steps down", where, answer.term, before)

    def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._tasks.spawn(self._serve_client(reader, writer))

    async def _key_for(self, opening: auth.Opening) -> bytes | None:
        return self._key if opening.role == auth.ROLE_MASTER else None

    async def _serve_client(self, reader: asyncio.StreamReader,
                            writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        set_nodelay(writer.transport)
        admitted = await self.gate.admit(reader, writer, self._key_for)
        if admitted is None:
            return
        peername = writer.get_extra_info("peername") or ("?", 0)
        log.debug("connection from %s:%s (handshake done)", peername[0], peername[1])
        first = await first_frame(reader, writer, self.state.probe, _BEFORE_HELLO,
                                  self.state.limits.hello_timeout, self._budget)
        if first is None:
            return
        body, msg = first
        if isinstance(msg, m.Hello):  # (with a master secret: a rejoin's claims need a seal)
            msg = self._keys.screen(msg, str(peername[0]))
        rejoin = msg.rejoin if isinstance(msg, m.Hello) else None
        if rejoin is not None and isinstance(msg, m.Hello):  # a run it takes over frees its id
            self._handle(ms.Rejoining(msg, loop.time()))
        conn = self.state.allocate(rejoin.peer_id if rejoin is not None else 0,
                                   refused=rejoin is not None and rejoin.peer_id == 0)
        self._sessions[conn] = admitted[1]
        self._writers[conn] = self._owners[conn] = writer
        self._handle(ms.Connected(conn, str(peername[0]), loop.time()))
        log.debug("connection %d from %s", conn, peername)
        limit = _BEFORE_HELLO
        try:
            if isinstance(msg, str):  # the first frame was malformed: an answer, then closed
                self._handle(ms.Malformed(conn, msg, loop.time(), body))
            else:
                limit = self._max_frame if isinstance(msg, m.Hello) else limit
                self._handle(ms.Received(conn, msg, loop.time()))
            while conn in self._writers:
                try:
                    body = await read_frame(reader, limit, self._budget)
                except RemoteProtocolError as exc:
                    self._handle(ms.Malformed(conn, str(exc), loop.time()))
                    break
                try:  # (most of an idle run's frames are heartbeats: decoded once)
                    msg = _HEARTBEAT if body == _BEAT else m.decode_peer_to_master(body)
                except RemoteProtocolError as exc:
                    self._handle(ms.Malformed(conn, str(exc), loop.time(), body))
                    break
                if isinstance(msg, m.CollectiveDone) and not msg.ok:
                    await self._await_suspect(msg.suspect)
                    self._reap_closed(conn)
                elif isinstance(msg, m.Hello):
                    limit = self._max_frame
                self._handle(ms.Received(conn, msg, loop.time()))
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        except Exception:  # a bug: this connection ends, the master serves the others
            log.exception("master: connection %d failed", conn)
        finally:
            if self._owners.get(conn) is writer:  # (a rejoining peer may hold its id now)
                del self._owners[conn]
                self._handle(ms.Disconnected(conn, loop.time()))
                self._writers.pop(conn, None)
                self._sessions.pop(conn, None)
                self._keys.forget(conn)
                gone = self._gone.pop(conn, None)
                if gone is not None and not gone.done():
                    gone.set_result(None)
            writer.close()

    async def _await_suspect(self, suspect: int) -> None:
        """A peer reports that its data connection with ``suspect`` broke. If ``suspect``'s
        control connection is still open, give it up to ``SUSPECT_GRACE`` s to close: a
        killed process's sockets do not all close at once (under load its data connection
        can close milliseconds before its control connection), and the abort must reach
        the survivors after the membership update. Blocks only this reporter's reader."""
        if suspect not in self._writers:
            return
        gone = self._gone.setdefault(suspect, asyncio.get_running_loop().create_future())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(gone), SUSPECT_GRACE)

    def _reap_closed(self, reporter: int) -> None:
        """Before a peer's failure report aborts a collective, drop every other peer whose
        connection is already at EOF or reset, so the abort reaches the survivors after the
        membership update (their world size is then fresh): a connection whose EOF the loop
        has not read yet. Never blocks: one non-blocking peek per peer."""
        loop = asyncio.get_running_loop()
        for conn, writer in list(self._writers.items()):
            if conn == reporter or writer.is_closing():
                continue
            own = own_socket(writer.transport)
            if own is None:
                continue  # not a socket we can peek at
            with own:
                gone = at_eof(own)
            if gone:
                log.debug("connection %d closed before a failure report: removing it first", conn)
                self._writers.pop(conn, None)
                self._handle(ms.Disconnected(conn, loop.time()))
                writer.close()


_HEARTBEAT = m.Heartbeat()
_BEAT = m.encode(_HEARTBEAT)
SUSPECT_GRACE = 0.1  # s a failure report waits for the suspect's control connection to close
_BEFORE_HELLO = 64 << 10  # the largest frame a connection may send before its Hello
_LARGE_FRAMES = 32 << 20  # bytes of frames above 64 KiB being received at once, all peers
_BACKLOG = 1 << 20  # bytes waiting to be sent to one connection: more, and it is closed
