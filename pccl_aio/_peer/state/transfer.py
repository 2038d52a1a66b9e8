"""Shared-state transfer between peers: a server that serves byte ranges during a sync, and a
fetcher that pulls dirty entries straight into the requester's tensors.

The wire format is ``_wire/state.py``; every connection first completes the handshake of
``_net/handshake.py``, which names the requesting peer. The fetcher opens, per source, as many
connections as its bandwidth-delay product needs (``streams_for``: the first connection's RTT,
as the data plane's links do), keeps ``DEPTH`` requests in flight on each (no idle round trip
between two pieces), and shares the ranges of every source through one work queue, cut into
pieces of ``piece_size``: a faster source takes more of them. A connection that fails hands
back the part of its pieces that did not arrive; what did arrive is kept.
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
from ..data.core import bdp
from ..data.link import send_window, tcp_rtt

PIECE = 8 << 20  # the largest range one request asks for
MIN_PIECE = 1 << 20  # the smallest (but for the end of an entry)
STREAMS = 2  # connections per source, at least (loopback, a LAN)
DEPTH = 2  # requests in flight per connection: the next one is asked before this one ends
MAX_PER_PEER = 16  # connections one peer may hold to a state server (the fetcher: at most 8)
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
        except RuntimeError:  # (uvloop's write to a transport ``abort`` closed)
            if not writer.transport.is_closing():
                raise
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


def streams_for(rtt: float | None, window: int) -> int:
    """Connections to open to one source: ``STREAMS``, or more where one connection's window
    (``window``: the send-buffer ceiling) cannot fill the bandwidth-delay product at ``rtt``
    seconds (``bdp.choose_connections``, bandwidth assumed, at most ``bdp.AUTO_CAP``);
    ``STREAMS`` for an unknown RTT."""
    if rtt is None:
        return STREAMS
    return max(STREAMS, bdp.choose_connections(rtt, None, window))


def piece_size(total: int, streams: int) -> int:
    """The bytes one request asks for in a fetch of ``total`` bytes over ``streams``
    connections: about a quarter of one connection's share, so that the last pieces end
    close together, within [``MIN_PIECE``, ``PIECE``]."""
    share = -(-total // (4 * max(1, streams)))
    return min(PIECE, max(MIN_PIECE, share))


def take(queue: list[tuple[str, int, memoryview]], size: int) -> tuple[str, int, memoryview]:
    """Pop the next piece of at most ``size`` bytes from ``queue`` (pieces in reverse order:
    the next at the end); the rest of a longer range goes back in its place."""
    key, off, view = queue.pop()
    if view.nbytes > size:
        queue.append((key, off + size, view[size:]))
        view = view[:size]
    return key, off, view


class _Request:
    """One range asked on a connection: where its bytes go and how many arrived."""

    __slots__ = ("body", "target", "waiter")

    def __init__(self, target: memoryview, waiter: asyncio.Future[None]) -> None:
        self.target, self.waiter, self.body = target, waiter, 0


class _FetchProtocol(asyncio.BufferedProtocol):
    """Client side of one connection: receives the answers to its requests, in order, straight
    into their targets. A failure fails every request in flight; each keeps the count of its
    bytes that arrived (``received``)."""

    def __init__(self, on_bytes: Callable[[int], None] | None = None) -> None:
        self.transport: asyncio.Transport | None = None
        self.pending: collections.deque[_Request] = collections.deque()  # asked, not answered
        self.on_bytes = on_bytes  # told of each body read
        self._hdr = bytearray(RESP.size)
        self._got = 0
        self._want = RESP.size
        self._in_header = True
        self._failed: Exception | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        set_nodelay(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.fail(ConnectionResetError("state source closed the connection"))

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._in_header or not self.pending:
            return memoryview(self._hdr)[self._got : RESP.size]
        return self.pending[0].target[self._got : self._want]

    def buffer_updated(self, nbytes: int) -> None:
        self._got += nbytes
        if not self._in_header:
            self.pending[0].body += nbytes
            if self.on_bytes is not None:
                self.on_bytes(nbytes)
        if self._got < self._want:
            return
        if self._in_header:
            status, length = parse_response(self._hdr) or (-1, 0)
            if status != OK or not self.pending or length != len(self.pending[0].target):
                self.fail(ConnectionError(f"state source refused the range (status {status})"))
                return
            self._in_header, self._got, self._want = False, 0, length
            if length:
                return
        req = self.pending.popleft()
        self._in_header, self._got, self._want = True, 0, RESP.size
        if not req.waiter.done():
            req.waiter.set_result(None)

    def fail(self, exc: Exception) -> None:
        """Drop the connection now (nothing more is written into a target) and fail every
        request in flight with ``exc``."""
        if self._failed is None:
            self._failed = exc
        if self.transport is not None:
            self.transport.abort()
        for req in self.pending:
            if not req.waiter.done():
                req.waiter.set_exception(self._failed)
                req.waiter.exception()  # (retrieved: a cancelled fetch no longer awaits it)

    def received(self, target: memoryview) -> int:
        """The bytes of ``target``'s request that arrived (0 once it was answered whole)."""
        return next((r.body for r in self.pending if r.target is target), 0)

    async def fetch(self, key: str, revision: int, offset: int, target: memoryview) -> None:
        """Request ``len(target)`` bytes of ``key`` from ``offset`` and receive them in place,
        after the answers to the requests already in flight. Raises ConnectionError if the
        connection fails first; cancelling stops waiting only (``fail`` the connection then:
        the bytes may still come)."""
        if self.transport is None or self._failed is not None:
            raise ConnectionResetError("state source connection closed")
        req = _Request(target, asyncio.get_running_loop().create_future())
        self.pending.append(req)
        self.transport.write(pack_request(key, revision, offset, len(target)))
        await req.waiter


async def fetch_ranges(sources: list[Source], revision: int,
                       pieces: list[tuple[str, int, memoryview]], timeout: float, me: int,
                       tls: ssl.SSLContext | None = None, streams: int | None = None,
                       on_bytes: Callable[[int], None] | None = None,
                       served: collections.Counter[int] | None = None) -> int:
    """Fetch every (key, offset, target) range from any of ``sources``; returns the bytes
    received (each once: the ranges' total when it succeeds).

    Per source, ``streams`` connections (None: ``streams_for`` the first one's RTT) with
    ``DEPTH`` requests in flight each take pieces of ``piece_size`` (of the bytes still queued
    over the connections planned: a source's count is the cap until its RTT is read, so the
    first pieces are not the largest, and the last ones are small) from one shared queue. A
    failing connection hands back what did not arrive of its pieces; what did stays, and
    counts. ``on_bytes(n)`` hears of every read into a target; ``served`` counts the bytes
    each source (peer id) delivered. Blocks until every range arrived; raises
    ``ConnectionError`` if ranges remain when every source failed, or ``TimeoutError`` if a
    piece makes no progress for ``timeout`` seconds. Cancelling closes every connection.
    """
    queue: list[tuple[str, int, memoryview]] = list(reversed(pieces))
    left = sum(p[2].nbytes for p in pieces)  # bytes in the queue: pieces shrink to the end
    planned = {s.peer_id: streams or bdp.AUTO_CAP for s in sources}  # (until an RTT is read)
    received = 0
    busy = 0  # pieces in flight: a failing one comes back, so idle workers must wait
    changed = asyncio.Event()
    errors: list[BaseException] = []
    opened: list[_FetchProtocol] = []

    async def open_one(src: Source) -> _FetchProtocol | None:
        proto = _FetchProtocol(on_bytes)
        try:
            async with asyncio.timeout(timeout):
                await connect(src.host, src.port, tls, auth.ROLE_STATE, src.key, me,
                              src.peer_id, proto)
        except (OSError, TimeoutError) as exc:
            errors.append(exc)
            return None
        opened.append(proto)
        return proto

    async def lane(src: Source, proto: _FetchProtocol) -> None:
        nonlocal received, busy, left
        while queue or busy:
            if proto.transport is None:
                return
            if not queue:
                changed.clear()
                await changed.wait()
                continue
            key, off, target = take(queue, piece_size(left, sum(planned.values())))
            left -= len(target)
            busy += 1
            got = 0
            try:
                async with asyncio.timeout(timeout + DEPTH * len(target) / 50e6):
                    await proto.fetch(key, revision, off, target)
                got = len(target)
            except Exception as exc:
                proto.fail(ConnectionResetError(f"state fetch from peer {src.peer_id} failed"))
                got = proto.received(target)
                queue.append((key, off + got, target[got:]))  # the rest, from any connection
                left += len(target) - got
                errors.append(exc)
                if got:
                    log.info("state fetch from peer %d: connection lost after %d of %d B of a "
                             "range; the other connections fetch the rest", src.peer_id, got,
                             len(target))
                return
            finally:
                received += got
                if served is not None and got:
                    served[src.peer_id] += got
                busy -= 1
                changed.set()

    async def more(src: Source) -> None:
        proto = await open_one(src)
        if proto is not None:
            await asyncio.gather(*(lane(src, proto) for _ in range(DEPTH)))

    async def source(src: Source) -> None:
        first = await open_one(src)
        if first is None:
            return
        k = planned[src.peer_id] = streams or streams_for(
            tcp_rtt(first.transport) if first.transport else None, send_window())
        await asyncio.gather(*(lane(src, first) for _ in range(DEPTH)),
                             *(more(src) for _ in range(k - 1)))

    try:
        await asyncio.gather(*(source(src) for src in sources))
    finally:
        for proto in opened:
            if proto.transport is None:
                continue
            if proto.pending:  # cancelled mid-piece: drop what is still coming
                proto.transport.abort()
            else:
                proto.transport.close()
    if queue:
        raise ConnectionError(f"{len(queue)} range(s) left after every source failed: "
                              f"{errors[-1] if errors else 'no source'}")
    return received


def split(key: str, view: memoryview, piece: int = PIECE) -> list[tuple[str, int, memoryview]]:
    """Cut an entry into (key, offset, target) pieces of at most ``piece`` bytes."""
    return [(key, off, view[off : off + piece]) for off in range(0, view.nbytes, piece)] or \
        [(key, 0, view[0:0])]
