"""Shared-state transfer between peers: a server that serves byte ranges during a sync, and a
fetcher that pulls dirty entries straight into the requester's tensors.

The wire format is ``_wire/state.py``; every connection first completes the handshake of
``_net/handshake.py``, which names the requesting peer. The fetcher spreads byte ranges over
all sources through a shared work queue; a source that fails hands its range back and the
others finish the job.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import NamedTuple, cast

from ..._net.handshake import Gate, KeyFor, connect
from ..._net.stream import set_nodelay
from ..._net.tasks import TaskSet
from ..._wire import auth
from ..._wire.state import (
    BAD_RANGE,
    NOT_SERVING,
    OK,
    REQ,
    RESP,
    pack_request,
    pack_response,
    parse_request,
    parse_response,
)

PIECE = 8 << 20
MAX_PER_PEER = 16  # connections one peer may hold to a state server (the fetcher opens 2)
log = logging.getLogger("pccl_aio.state")

#: (requesting peer, key, revision) -> what to serve, or None to refuse (may wait for a plan).
Lookup = Callable[[int, str, int], Awaitable[memoryview | None]]


class Source(NamedTuple):
    """A peer to fetch from, and the key for its handshake."""

    host: str
    port: int
    peer_id: int
    key: bytes


class StateServer:
    """Answers range requests with what ``lookup`` serves (nothing outside a sync), counting
    bytes sent. Connections pass ``gate`` with a key from ``key_for`` first. Connection
    handlers are tasks of its own ``TaskSet``, ended by ``close``."""

    def __init__(self, lookup: Lookup, key_for: KeyFor, gate: Gate) -> None:
        self.lookup: Lookup | None = lookup
        self._key_for, self._gate = key_for, gate
        self._by_peer: collections.Counter[int] = collections.Counter()  # open connections
        self.tx = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks = TaskSet("pccl_aio state server")
        self.port = 0

    async def start(self, host: str, tls: ssl.SSLContext | None = None) -> None:
        """Listen on an OS-chosen port of ``host`` (``port`` tells it), over TLS with ``tls``."""
        self._server = await asyncio.start_server(
            self._serve, host, 0, ssl=tls,
            ssl_handshake_timeout=self._gate.timeout if tls else None)
        self.port = self._server.sockets[0].getsockname()[1]

    def connections(self, peer_id: int) -> int:
        """The connections ``peer_id`` holds open to this server now (at most
        ``MAX_PER_PEER``)."""
        return self._by_peer[peer_id]

    def abort(self) -> None:
        """Stop listening and drop every connection at once."""
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.transport.abort()

    async def close(self) -> None:
        """``abort`` and wait until every connection handler ended."""
        self.abort()
        await self._tasks.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.adopt(task)
        set_nodelay(writer.transport)
        self._writers.add(writer)
        try:
            admitted = await self._gate.admit(reader, writer, self._key_for)
            if admitted is None:
                return
            peer = admitted[0].client_id
            if self._by_peer[peer] >= MAX_PER_PEER:
                log.warning("state server: closing connection %d from peer %d (at most %d)",
                            self._by_peer[peer] + 1, peer, MAX_PER_PEER)
                return
            self._by_peer[peer] += 1
            try:
                await self._answer(peer, reader, writer)
            finally:
                self._by_peer[peer] -= 1
                if not self._by_peer[peer]:
                    del self._by_peer[peer]
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _answer(self, peer: int, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        """Answer ``peer``'s requests until it closes or breaks the protocol."""
        while True:
            req = parse_request(await reader.readexactly(REQ.size))
            if req is None:
                return
            klen, revision, off, length = req
            key = (await reader.readexactly(klen)).decode("utf-8", "replace")
            view = await self.lookup(peer, key, revision) if self.lookup is not None else None
            if view is None:
                writer.write(pack_response(NOT_SERVING))
            elif off + length > view.nbytes:
                writer.write(pack_response(BAD_RANGE))
            else:
                writer.write(pack_response(OK, length))
                writer.write(view[off : off + length])
                self.tx += length
            await writer.drain()


class _FetchProtocol(asyncio.BufferedProtocol):
    """Client side of one connection: receives each answer straight into its target view."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._hdr = bytearray(RESP.size)
        self._target: memoryview | None = None
        self._got = 0
        self._want = RESP.size
        self._in_header = True
        self._waiter: asyncio.Future[int] | None = None
        self.on_bytes: Callable[[int], None] | None = None  # told of each body read
        self.body = 0  # bytes of the current range received so far
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        set_nodelay(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(ConnectionResetError("state source closed the connection"))
        if not self.closed.done():
            self.closed.set_result(None)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._in_header or self._target is None:
            return memoryview(self._hdr)[self._got : RESP.size]
        return self._target[self._got : self._want]

    def buffer_updated(self, nbytes: int) -> None:
        self._got += nbytes
        if not self._in_header:
            self.body += nbytes
            if self.on_bytes is not None:
                self.on_bytes(nbytes)
        if self._got < self._want:
            return
        if self._in_header:
            status, length = parse_response(self._hdr) or (-1, 0)
            if status != OK or self._target is None or length != len(self._target):
                self._finish(exc=ConnectionError(
                    f"state source refused the range (status {status})"))
                return
            self._in_header, self._got, self._want = False, 0, length
            if length:
                return
        self._finish()

    def _finish(self, exc: Exception | None = None) -> None:
        w, self._waiter = self._waiter, None
        self._in_header, self._got, self._want, self._target = True, 0, RESP.size, None
        if w is not None and not w.done():
            if exc is None:
                w.set_result(0)
            else:
                w.set_exception(exc)
                if self.transport is not None:
                    self.transport.abort()

    async def fetch(self, key: str, revision: int, offset: int, target: memoryview) -> None:
        """Request ``len(target)`` bytes of ``key`` from ``offset`` and receive them in place."""
        if self.transport is None:
            raise ConnectionResetError("state source connection closed")
        self._waiter = asyncio.get_running_loop().create_future()
        self._target, self.body = target, 0
        self.transport.write(pack_request(key, revision, offset, len(target)))
        await self._waiter


async def fetch_ranges(sources: list[Source], revision: int,
                       pieces: list[tuple[str, int, memoryview]], timeout: float, me: int,
                       tls: ssl.SSLContext | None = None, streams: int = 2,
                       on_bytes: Callable[[int], None] | None = None,
                       served: collections.Counter[int] | None = None) -> int:
    """Fetch every (key, offset, target) piece from any of ``sources``; returns bytes received.

    Pieces are shared by ``streams`` workers (one connection each) per source; a failing
    connection returns its piece to the queue. ``on_bytes(n)`` hears of every read into a
    target, and of ``-n`` for the bytes of a piece that failed (they come again); ``served``
    counts the bytes of the pieces each source (peer id) delivered. Raises
    ``ConnectionError`` if pieces remain when every source failed, or ``TimeoutError`` if a
    piece makes no progress for ``timeout`` seconds.
    """
    queue: list[tuple[str, int, memoryview]] = list(reversed(pieces))
    received = 0
    busy = 0  # pieces in flight: a failing one comes back, so idle workers must wait
    changed = asyncio.Event()
    errors: list[BaseException] = []

    async def open_source(src: Source) -> _FetchProtocol:
        proto = _FetchProtocol()
        await connect(src.host, src.port, tls, auth.ROLE_STATE, src.key, me, src.peer_id, proto)
        return proto

    async def worker(src: Source) -> None:
        nonlocal received, busy
        try:
            proto = await asyncio.wait_for(open_source(src), timeout)
        except (OSError, TimeoutError) as exc:
            errors.append(exc)
            return
        proto.on_bytes = on_bytes
        try:
            while queue or busy:
                if not queue:
                    changed.clear()
                    await changed.wait()
                    continue
                piece = queue.pop()
                busy += 1
                try:
                    async with asyncio.timeout(timeout + len(piece[2]) / 50e6):
                        await proto.fetch(piece[0], revision, piece[1], piece[2])
                except BaseException as exc:
                    queue.append(piece)
                    errors.append(exc)
                    proto.on_bytes = None
                    if on_bytes is not None and proto.body:
                        on_bytes(-proto.body)
                    return
                else:
                    received += len(piece[2])
                    if served is not None:
                        served[src.peer_id] += len(piece[2])
                finally:
                    busy -= 1
                    changed.set()
        finally:
            if proto.transport is not None:
                proto.transport.close()

    await asyncio.gather(*(worker(src) for src in sources for _ in range(streams)))
    if queue:
        raise ConnectionError(f"{len(queue)} piece(s) left after every source failed: "
                              f"{errors[-1] if errors else 'no source'}")
    return received


def split(key: str, view: memoryview, piece: int = PIECE) -> list[tuple[str, int, memoryview]]:
    """Cut an entry into (key, offset, target) pieces of at most ``piece`` bytes."""
    return [(key, off, view[off : off + piece]) for off in range(0, view.nbytes, piece)] or \
        [(key, 0, view[0:0])]

