"""The sending side of point-to-point: ``Outbox`` keeps one connection to each peer this
one sends to (``Channel``) and writes its messages in the order they were sent.

A send completes when its bytes are handed to the connection (the transport holds at most
``WRITE_HIGH`` bytes of it; the receiver may not have them yet), as with gloo. It fails
with ``PeerLostError`` if the connection cannot be opened (within ``connect_timeout``) or
is lost before that, or if the peer leaves the peer group; the next send opens a fresh
connection. Runs on the event loop; cancelling a send stops waiting (bytes written stay
written).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import cast

from ..._errors import PcclError, PeerLostError
from ..._net.handshake import connect
from ..._net.stream import set_nodelay
from ..._net.tasks import TaskSet
from ..._wire import auth
from ..._wire import messages as m
from ..._wire.p2p import Key, pack_header
from .mailbox import retrieved

WRITE_HIGH, WRITE_LOW = 256 << 10, 64 << 10

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

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        t = self.transport = cast(asyncio.Transport, transport)
        t.set_write_buffer_limits(WRITE_HIGH, WRITE_LOW)
        set_nodelay(transport)

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
        self.transport = None
        self.fail(PeerLostError(f"the point-to-point connection to peer {self.peer} was "
                                f"lost ({exc!r})" if exc else
                                f"peer {self.peer} closed the point-to-point connection"))

    def write(self, header: bytes, payload: memoryview, fut: asyncio.Future[int]) -> None:
        """Write one message now; ``fut`` completes once the transport has room again."""
        t = self.transport
        if t is None:
            fut.set_exception(self.error or PeerLostError(f"no connection to peer {self.peer}"))
            return
        if payload.nbytes:
            t.writelines((header, payload))
        else:
            t.write(header)
        self.tx_bytes += len(header) + payload.nbytes
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
