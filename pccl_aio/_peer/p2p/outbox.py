"""The sending side of point-to-point: ``Outbox`` keeps one connection to each peer this
one sends to (``Channel``) and writes its messages in the order they were sent.

A send completes when its bytes are handed to the connection (the transport holds at most
``WRITE_HIGH`` bytes of it; the receiver may not have them yet), as with gloo. A small send
from another thread (``Outbox.send_now``: the blocking facade's, torch's) is written by that
thread straight to the socket when nothing is waiting to be written before it on a plain TCP
connection, as gloo's caller does: no hop to the loop thread and back (``Channel.lock``
orders it with the loop's writes). It fails
with ``PeerLostError`` if the connection cannot be opened (within ``connect_timeout``) or
is lost before that, or if the peer leaves the peer group; the next send opens a fresh
connection. Runs on the event loop; cancelling a send stops waiting (bytes written stay
written).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import socket
import ssl
import threading
from collections.abc import Callable
from typing import cast

from ..._errors import PcclError, PeerLostError
from ..._net.handshake import connect
from ..._net.stream import own_socket, set_nodelay
from ..._net.tasks import TaskSet
from ..._wire import auth
from ..._wire import messages as m
from ..._wire.p2p import Key, pack_header
from .mailbox import retrieved

WRITE_HIGH, WRITE_LOW = 256 << 10, 64 << 10
DIRECT_MAX = 64 << 10  # largest payload ``send_now`` writes from the calling thread
_SEND_FLAGS = socket.MSG_DONTWAIT | getattr(socket, "MSG_NOSIGNAL", 0)

Pending = tuple[bytes, memoryview, "asyncio.Future[int]"]


class Channel(asyncio.Protocol):
    """The connection to one peer and the sends waiting for it."""

    def __init__(self, peer: int) -> None:
        self.peer = peer
        self.transport: asyncio.Transport | None = None
        self.queued: list[Pending] = []  # sends before the connection opened
        self.draining: list[asyncio.Future[int]] = []  # written, waiting for room
        self.error: PcclError | None = None
        self.paused = False
        self.opening: asyncio.Task[None] | None = None
        self.tx_bytes = 0
        #: held by every write to the connection: the loop's and ``send_now``'s
        self.lock = threading.Lock()
        #: a dup of a plain TCP connection's socket, for ``send_now`` (None: TLS, closed)
        self.sock: socket.socket | None = None
        #: rests of ``send_now`` messages the socket took in part, for the loop to write
        self.tails: list[tuple[memoryview, concurrent.futures.Future[int]]] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        t = cast(asyncio.Transport, transport)
        t.set_write_buffer_limits(WRITE_HIGH, WRITE_LOW)
        set_nodelay(transport)
        with self.lock:
            self.transport = t
            if transport.get_extra_info("sslcontext") is None:
                self.sock = own_socket(transport)

    def _drop_sock(self) -> None:
        with self.lock:
            sock, self.sock = self.sock, None
        if sock is not None:
            sock.close()  # (before the transport's close: the dup holds the connection open)

    def send_now(self, header: bytes, payload: memoryview,
                 loop: asyncio.AbstractEventLoop) -> concurrent.futures.Future[int] | None:
        """From a thread other than the loop's: write the message now if the connection is
        plain TCP and nothing waits to be written before it; None if nothing was written
        (send it through the loop). The future is done at once, or once the loop wrote the
        rest of a message the socket took only part of."""
        with self.lock:
            t, sock = self.transport, self.sock
            if t is None or sock is None or self.error is not None or self.paused or \
                    self.tails or self.queued or t.get_write_buffer_size():
                return None
            try:
                n = sock.sendmsg((header, payload), (), _SEND_FLAGS)
            except (BlockingIOError, InterruptedError):
                return None
            except OSError:
                return None  # (the loop's send meets the same error and fails the send)
            self.tx_bytes += n
            done: concurrent.futures.Future[int] = concurrent.futures.Future()
            total = len(header) + payload.nbytes
            if n == total:
                done.set_result(0)
                return done
            self.tails.append((memoryview(header + payload.tobytes())[n:], done))
        loop.call_soon_threadsafe(self.flush)
        return done

    def flush(self) -> None:
        """On the loop: write the rests of ``send_now``'s messages the socket took in part
        (every loop write does this first, so nothing overtakes them)."""
        with self.lock:
            done = self._flush()
        self._settle(done)

    def _flush(self) -> list[concurrent.futures.Future[int]]:
        """(With ``lock`` held.) Hand the rests to the transport; their futures, to settle."""
        tails, self.tails = self.tails, []
        t = self.transport
        if t is not None:
            for rest, _ in tails:
                t.write(rest)
                self.tx_bytes += rest.nbytes
        return [f for _, f in tails]

    def _settle(self, done: list[concurrent.futures.Future[int]]) -> None:
        for f in done:
            if self.transport is None:  # (lost: the rest may not have gone out)
                f.set_exception(self.error or PeerLostError(
                    f"the point-to-point connection to peer {self.peer} was lost"))
            else:
                f.set_result(0)  # (handed to the transport, as a loop's send)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        done, self.draining = self.draining, []
        for fut in done:
            if not fut.done():
                fut.set_result(0)

    def data_received(self, data: bytes) -> None:
        self.close()  # (nothing is ever sent back on a point-to-point connection)

    def connection_lost(self, exc: Exception | None) -> None:
        with self.lock:
            self.transport = None
        self._drop_sock()
        self.fail(PeerLostError(f"the point-to-point connection to peer {self.peer} was "
                                f"lost ({exc!r})" if exc else
                                f"peer {self.peer} closed the point-to-point connection"))

    def write(self, header: bytes, payload: memoryview, fut: asyncio.Future[int]) -> None:
        """Write one message now; ``fut`` completes once the transport has room again."""
        with self.lock:
            tails = self._flush() if self.tails else []
            t = self.transport
            if t is not None:
                if payload.nbytes:
                    t.writelines((header, payload))
                else:
                    t.write(header)
                self.tx_bytes += len(header) + payload.nbytes
        self._settle(tails)
        if t is None:
            fut.set_exception(self.error or PeerLostError(f"no connection to peer {self.peer}"))
            return
        if self.paused:
            self.draining.append(fut)
        else:
            fut.set_result(0)

    def opened(self) -> None:
        """The connection is up: write what was queued, in order."""
        queued, self.queued = self.queued, []
        for header, payload, fut in queued:
            if not fut.done():
                self.write(header, payload, fut)

    def fail(self, exc: PcclError) -> None:
        """The connection is gone (or never came): fail every send waiting on it."""
        if self.error is None:
            self.error = exc
        waiting = [f for *_, f in self.queued] + self.draining
        self.queued, self.draining = [], []
        for fut in waiting:
            if not fut.done():
                fut.set_exception(exc)

    def close(self) -> None:
        if self.opening is not None and not self.opening.done():
            self.opening.cancel()
        self._drop_sock()
        if self.transport is not None:
            self.transport.abort()


class Outbox:
    """One ``Channel`` per destination peer. ``address(peer)`` gives the peer's listener
    (None: not in the ring), ``key(peer)`` the pair key for the handshake."""

    def __init__(self, me: Callable[[], int], address: Callable[[int], m.PeerAddr | None],
                 key: Callable[[int], bytes], tls: ssl.SSLContext | None,
                 connect_timeout: float, tasks: TaskSet) -> None:
        self._me, self._address, self._key, self._tls = me, address, key, tls
        self._timeout, self._tasks = connect_timeout, tasks
        self._channels: dict[int, Channel] = {}
        self._closed: PcclError | None = None
        self.tx_bytes = 0

    def send(self, peer: int, key: Key, payload: memoryview) -> asyncio.Future[int]:
        """Queue one message with ``key`` to ``peer``; the future completes as the module
        says."""
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        fut.add_done_callback(retrieved)
        if self._closed is not None:
            fut.set_exception(self._closed)
            return fut
        header = pack_header(key, payload.nbytes)
        ch = self._channels.get(peer)
        if ch is not None and ch.error is not None:
            self._forget(ch)
            ch = None
        if ch is None:
            addr = self._address(peer)
            if addr is None:
                fut.set_exception(PeerLostError(f"peer {peer} is not in the peer group"))
                return fut
            ch = self._channels[peer] = Channel(peer)
            ch.opening = self._tasks.spawn(self._open(ch, addr),
                                           name=f"pccl_aio p2p to {peer}")
        if ch.transport is None:
            ch.queued.append((header, payload, fut))
        else:
            ch.write(header, payload, fut)
        return fut

    def send_now(self, peer: int, key: Key, payload: memoryview,
                 loop: asyncio.AbstractEventLoop) -> concurrent.futures.Future[int] | None:
        """``Channel.send_now`` on the open connection to ``peer`` (from a thread other than
        the loop's); None where there is none or the message is over ``DIRECT_MAX``."""
        ch = self._channels.get(peer)
        if ch is None or self._closed is not None or payload.nbytes > DIRECT_MAX:
            return None
        return ch.send_now(pack_header(key, payload.nbytes), payload, loop)

    async def _open(self, ch: Channel, addr: m.PeerAddr) -> None:
        try:
            async with asyncio.timeout(self._timeout):
                await connect(addr.host, addr.port, self._tls, auth.ROLE_P2P,
                              self._key(ch.peer), self._me(), ch.peer, ch)
        except (OSError, TimeoutError) as exc:
            ch.fail(PeerLostError(f"cannot connect to peer {ch.peer} at {addr.host}:"
                                  f"{addr.port} for point-to-point: {exc!r}"))
            return
        except asyncio.CancelledError:
            ch.fail(self._closed or PeerLostError(f"peer {ch.peer} left the peer group"))
            raise
        ch.opened()

    def _forget(self, ch: Channel) -> None:
        if self._channels.get(ch.peer) is ch:
            del self._channels[ch.peer]
        self.tx_bytes += ch.tx_bytes
        ch.tx_bytes = 0
        ch.close()

    def reset(self, peer: int, exc: PcclError) -> None:
        """Fail the sends to ``peer`` and close the connection (its receives from this peer
        then fail too); the next send opens a fresh one."""
        ch = self._channels.get(peer)
        if ch is not None:
            ch.fail(exc)
            self._forget(ch)

    def on_ring(self, alive: set[int]) -> None:
        """The peer group is now ``alive``: sends to a peer that left fail, its
        connection is closed."""
        for ch in [c for p, c in self._channels.items() if p not in alive]:
            ch.fail(PeerLostError(f"peer {ch.peer} left the peer group"))
            self._forget(ch)

    def written(self) -> int:
        """Bytes written on every connection so far (headers included)."""
        return self.tx_bytes + sum(c.tx_bytes for c in self._channels.values())

    def close(self, exc: PcclError) -> None:
        """Fail every send with ``exc`` (and every later one) and close every connection."""
        self._closed = exc
        for ch in list(self._channels.values()):
            ch.fail(exc)
            self._forget(ch)
