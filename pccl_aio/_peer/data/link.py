"""The data plane's sending side: a ``Link`` of ``k`` TCP connections to one ring neighbour.

Each frame goes to the connection with the fewest bytes waiting, so a stream that slows down
(loss, a small window) gets less and the others carry the rest. Unless ``p2p_connections``
fixes ``k``, the first connection measures the RTT and ``core/bdp.py`` picks ``k`` from the
bandwidth-delay product. The receiving side is ``receiver.py``; the formats are
``_wire/data.py``.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from typing import cast

from ..._net.handshake import connect
from ..._net.stream import own_socket, set_nodelay
from ..._net.tasks import TaskSet
from ..._text import plural
from ..._wire import auth
from ..._wire import messages as m
from ..._wire.data import HELLO, pack_hello
from ..core.config import PeerConfig
from .core import bdp

log = logging.getLogger("pccl_aio.link")
WMEM_PATH = "/proc/sys/net/ipv4/tcp_wmem"


def tcp_rtt(transport: asyncio.BaseTransport) -> float | None:
    """The connection's RTT in seconds from ``TCP_INFO`` (``bdp.rtt_from_tcp_info``), or
    None where the kernel gives none (not Linux, not TCP)."""
    sock = own_socket(transport)
    if sock is None:
        return None
    try:
        return bdp.rtt_from_tcp_info(
            sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, bdp.TCP_INFO_LEN))
    except (OSError, AttributeError):  # AttributeError: no socket.TCP_INFO here
        return None
    finally:
        sock.close()


def send_window() -> int:
    """This network namespace's send-buffer ceiling (``tcp_wmem`` max) in bytes."""
    try:
        with open(WMEM_PATH) as f:
            return bdp.wmem_max(f.read())
    except OSError:
        return bdp.DEFAULT_WMEM_MAX


class _Sender(asyncio.Protocol):
    """One outgoing data connection; tells its link when it has room again. Once the
    connection is gone it lets go of the link (the link holds it: a cycle would keep both,
    and what they hold, until a garbage-collector pass)."""

    def __init__(self, link: Link) -> None:
        self.link: Link | None = link
        self.transport: asyncio.Transport | None = None
        self.error: Exception | None = None
        self.paused = False
        self.queued = 0  # bytes ever handed to the transport (its FIFO position)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        set_nodelay(transport)
        self.transport.set_write_buffer_limits(high=WRITE_HIGH, low=WRITE_LOW)

    def connection_lost(self, exc: Exception | None) -> None:
        self.error = exc or ConnectionResetError("data connection closed")
        self.transport = None
        link, self.link = self.link, None
        if link is not None:
            link.wake()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.link is not None:
            self.link.wake()

    def data_received(self, data: bytes) -> None:
        pass  # the receiving side never writes

    @property
    def buffered(self) -> int:
        t = self.transport
        return t.get_write_buffer_size() if t is not None else 1 << 62

    def written(self, position: int) -> bool:
        """The bytes queued up to ``position`` were all passed to the kernel (their buffers
        are no longer referenced). False once the connection is gone."""
        return self.transport is not None and self.queued - self.buffered >= position


# Per-connection user-space queue limits: a frame is assigned to a connection only when one
# is under 256 KiB, so few bytes sit queued (and go cold) behind the kernel's own send buffer,
# which holds what is in flight. Paired P = 3 64 MiB loopback runs: 1 MiB took 0.94-0.97 of
# 4 MiB's time, 256 KiB 0.95-0.97 of 1 MiB's; the WAN bench (K = 8) read 0.81-0.85 of the
# link with either (bench/RESULTS.md).
WRITE_HIGH, WRITE_LOW = 256 << 10, 64 << 10


class Link:
    """``k`` TCP connections to one peer's listener.

    Each frame goes to the connection with the fewest bytes waiting (ties in turn), so a stream
    that slows down (loss, a small window) gets less and the others carry the rest: the
    aggregate is the sum of the streams' rates, not ``k`` times the slowest one's. ``k`` is
    ``config.p2p_connections`` or, if that is None, chosen when the link opens from the first
    connection's RTT, ``bandwidth`` (bits/s; None: ``bdp.ASSUMED_BANDWIDTH``) and the send
    window (``bdp.choose_connections``); it never changes afterwards, so a collective's frames
    are striped over the same connections from its first frame to its last.
    """

    def __init__(self, addr: m.PeerAddr, key: bytes, config: PeerConfig, me: int,
                 tasks: TaskSet, bandwidth: float | None = None) -> None:
        self.peer_id, self.host, self.port, self.me = addr.peer_id, addr.host, addr.port, me
        self.fixed, self._key = config.p2p_connections, key
        self.k = self.fixed or 1  # the connections, once open
        self.bandwidth = bandwidth
        self.rtt: float | None = None  # measured on the first connection (auto only)
        self._tls = config.ssl if config.ssl_server is not None else None
        self.senders: list[_Sender] = []
        self._tasks, self._timeout = tasks, config.data_timeout
        self._ready: asyncio.Task[None] | None = None
        self._room: asyncio.Future[None] | None = None
        self._failed = False
        self._turn = 0  # the connection a tie goes to next (``send_now``)

    def set_bandwidth(self, bits_per_s: float | None) -> None:
        """The link's measured bandwidth, for the choice of ``k``. It counts only if it comes
        before ``open``: an open link keeps its connections (``DataPlane.set_bandwidth``
        applies it when the link is next built)."""
        if self._ready is None:
            self.bandwidth = bits_per_s

    async def open(self) -> None:
        """Connect all ``k`` connections (once; concurrent callers share the attempt). With
        ``k`` automatic, the first connection is opened alone, to measure the RTT, then the
        others at once.

        Raises ``ConnectionError`` if any connection fails (its handshake included) or the
        attempt takes longer than the connect timeout; the ones that did connect are closed
        and the link is ``broken``, so the next collective builds a fresh one. Cancelling stops
        waiting only.
        """
        if self._ready is None:
            if self._failed:  # closed
                raise ConnectionError(f"the link to peer {self.peer_id} is closed")
            self._ready = self._tasks.spawn(self._connect(), name=f"pccl_aio link {self.peer_id}")
        try:
            await asyncio.shield(self._ready)
        except (OSError, TimeoutError) as exc:
            self._failed = True
            raise ConnectionError(
                f"cannot connect to peer {self.peer_id} at {self.host}:{self.port}: {exc!r}"
            ) from exc

    async def _connect(self) -> None:
        opened: list[_Sender] = []

        async def one(i: int) -> None:
            proto = _Sender(self)
            await connect(self.host, self.port, self._tls, auth.ROLE_DATA, self._key, self.me,
                          self.peer_id, proto)
            opened.append(proto)
            assert proto.transport is not None
            proto.transport.write(pack_hello(self.me, i))
            proto.queued = HELLO.size

        error: BaseException | None = None  # the first connection's, raised below
        try:
            async with asyncio.timeout(self._timeout), asyncio.TaskGroup() as tg:
                first = 0
                if self.fixed is None:
                    t0 = time.monotonic()
                    await one(0)
                    self.k = self._choose(opened[0], time.monotonic() - t0)
                    first = 1
                for i in range(first, self.k):
                    tg.create_task(one(i))
        except BaseException as exc:
            self._failed = True
            for proto in opened:  # no half-open link: close what did connect
                if proto.transport is not None:
                    proto.transport.abort()
            if not isinstance(exc, BaseExceptionGroup):
                raise
            error = exc.exceptions[0]
            exc.__traceback__ = None  # (3.11's TaskGroup.__aexit__ frame holds the group)
        if error is not None:
            # Raised outside the handler, so that the group is not its context. The error's
            # frames must not hold it, nor the group (which names this task, which keeps the
            # error): a cycle would keep this link until a garbage-collector pass.
            del tg
            try:
                raise error
            finally:
                error = None
        self.senders = opened

    def _choose(self, first: _Sender, connect_time: float) -> int:
        """``k`` for this link, from the first connection's RTT (TCP_INFO; else half the
        time its connect and two-round-trip handshake took, an overestimate)."""
        rtt = tcp_rtt(first.transport) if first.transport is not None else None
        self.rtt = rtt if rtt is not None else connect_time / 2
        window = send_window()
        k = bdp.choose_connections(self.rtt, self.bandwidth, window)
        log.info("link to peer %d: RTT %.2f ms, bandwidth %s, window %d B -> %s",
                 self.peer_id, self.rtt * 1e3,
                 "assumed" if self.bandwidth is None else f"{self.bandwidth / 1e6:.0f} Mbit/s",
                 window, plural(k, "connection"))
        return k

    @property
    def broken(self) -> bool:
        """The connect failed or a connection is gone: replace the link."""
        return self._failed or any(s.error is not None for s in self.senders)

    def wake(self) -> None:
        room, self._room = self._room, None
        if room is not None and not room.done():
            room.set_result(None)

    async def wait_room(self) -> None:
        """Wait until some connection takes a frame (``has_room``) or one of them is gone
        (``send_now`` then raises ConnectionResetError and the collective fails). Cancelling
        just stops waiting."""
        while not (self.has_room() or self.broken):
            if self._room is None:
                self._room = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._room)

    def has_room(self) -> bool:
        """Some connection takes a frame now without exceeding its write buffer limit."""
        for s in self.senders:  # a loop, not any(genexpr): this runs once per frame
            if not s.paused and s.error is None and s.transport is not None:
                return True
        return False

    def send_now(self, header: bytes, payload: memoryview) -> tuple[_Sender, int]:
        """Queue one frame on the least loaded connection at once (no waiting: the caller
        checked ``has_room`` or waited in ``wait_room``); returns that connection and the
        frame's end position (``_Sender.written`` tells when ``payload`` may be reused).
        Raises ConnectionResetError if a connection of the link is gone (the collective then
        fails and is retried on a fresh link). Frames left queued by an aborted attempt are
        dropped by the receiver as stale."""
        senders = self.senders
        best = senders[0]
        if (k := len(senders)) > 1:
            # Ties (usually: nothing waits above the kernel's buffers) go round-robin, so every
            # connection carries its share and stays warm; first-in-list would leave the last
            # ones idle with cold windows whenever the kernel absorbs a phase's frames.
            first = self._turn
            best = senders[first]
            for i in range(first, first + k):
                s = senders[i % k]
                if s.error is not None or s.transport is None:
                    raise ConnectionResetError(f"data connection lost: {s.error}")
                if (best.paused, best.buffered) > (s.paused, s.buffered):
                    best, first = s, i % k
            self._turn = (first + 1) % k
        t = best.transport
        if best.error is not None or t is None:
            raise ConnectionResetError(f"data connection lost: {best.error}")
        n = len(payload)
        if n:  # one writev for both: a syscall per frame, not two
            t.writelines((header, payload))
        else:
            t.write(header)
        end = best.queued = best.queued + len(header) + n
        return best, end

    def close(self) -> None:
        """Abort every connection. The connect task is let go (its error's frames hold
        this link: a cycle)."""
        ready, self._ready = self._ready, None
        if ready is not None and not ready.done():
            ready.cancel()
        self._failed = True  # (closed: never opened again)
        for s in self.senders:
            if s.transport is not None:
                s.transport.abort()
